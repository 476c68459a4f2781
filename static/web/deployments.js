// @ts-check
// The deployments list: its rows are re-rendered by the server after a change (unchanged rows,
// by their data-sig, stay as they are).
import { debounce, fragment, live } from "./core.js";

const body = /** @type {HTMLElement} */ (document.getElementById("deployments-body"));
const empty = document.getElementById("deployments-empty");

const refresh = debounce(async () => {
  let content;
  const team = document.getElementById("deployments-panel")?.dataset.team;
  try { content = await fragment(team ? `/ui/deployments?team=${encodeURIComponent(team)}` : "/ui/deployments"); } catch { return; }
  const rows = [...content.querySelectorAll("tr.dep-row")].map((row) => {
    const old = document.getElementById(row.id);
    return old && old.dataset.sig === /** @type {HTMLElement} */ (row).dataset.sig ? old : row;
  });
  const same = rows.length === body.children.length && rows.every((row, i) => body.children[i] === row);
  if (!same) body.replaceChildren(...rows);
  if (empty) empty.hidden = rows.length > 0;
}, 400);

live.on("frame", (frame) => {
  const c = frame.changed || {};
  // A replica's state moves with its deployment; an agent's ack finishes an operation.
  if (c.deployment || c.allocation || c.operation) refresh();
});
live.on("resync", () => refresh());
live.on("hello", () => live.subscribe([])); // no telemetry needed here
live.start();
