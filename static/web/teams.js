// @ts-check
// The team pages: the usage beside each limit follows the replicas live (the page's own tables
// are re-read from the server after a change; the admin forms are left as they are).
import { debounce, fragment, live } from "./core.js";

const TABLES = ["#teams tbody", "#team-limits tbody"];

const refresh = debounce(async () => {
  let content;
  try { content = await fragment(location.pathname); } catch { return; }
  for (const selector of TABLES) {
    const old = document.querySelector(selector);
    const fresh = content.querySelector(selector);
    if (old && fresh && old.innerHTML !== fresh.innerHTML) old.replaceWith(fresh);
  }
}, 800);

live.on("frame", (frame) => {
  const c = frame.changed || {};
  if (c.deployment || c.allocation || c.operation) refresh();
});
live.on("resync", () => refresh());
live.start();
