// @ts-check
// The hosts list: its rows are re-rendered by the server after a change (unchanged rows, by
// their data-sig, stay as they are).
import { debounce, fragment, live } from "./core.js";

const body = /** @type {HTMLElement} */ (document.getElementById("hosts-body"));
const empty = document.getElementById("hosts-empty");

const refresh = debounce(async () => {
  let content;
  try { content = await fragment("/ui/host-rows"); } catch { return; }
  const rows = [...content.querySelectorAll("tr.host-row")].map((row) => {
    const old = document.getElementById(row.id);
    return old && old.dataset.sig === /** @type {HTMLElement} */ (row).dataset.sig ? old : row;
  });
  const same = rows.length === body.children.length && rows.every((row, i) => body.children[i] === row);
  if (!same) body.replaceChildren(...rows);
  if (empty) empty.hidden = rows.length > 0;
}, 400);

live.on("frame", (frame) => {
  const c = frame.changed || {};
  // A host's status, labels or agent; a drain (an operation) scheduled, started or finished.
  if (c.host || c.operation) refresh();
});
live.on("resync", () => refresh());
live.on("hello", () => live.subscribe([])); // no telemetry needed here
live.start();
