// @ts-check
// The fleet view: live telemetry on every card, re-rendered cards after changes, filters and
// search, the deployments tray with drag-and-drop (and its keyboard/click alternative). Each
// concern is a module under fleet/; this one wires them to the live socket.
import "./fleet/highlight.js"; // reads ?highlight= before the filters rewrite the URL
import { fmtPct, live } from "./core.js";
import { changes } from "./fleet/changes.js";
import { enableDialogs } from "./fleet/dialogs.js";
import { enableDragAndDrop } from "./fleet/dragdrop.js";
import { applyFilters } from "./fleet/filters.js";
import { followReplicaRates } from "./fleet/rates.js";
import { firstScreenDrawn, observeLazy } from "./fleet/lazy.js";
import { announceVisible, observeHosts, paint, setText } from "./fleet/paint.js";
import { hostsBox } from "./fleet/state.js";
import { latest } from "./fleet/state.js";

const CARD_KINDS = ["gpu", "partition", "allocation", "host"];

live.on("frame", (frame) => {
  for (const [gpuId, values] of Object.entries(frame.telemetry || {})) {
    latest.set(gpuId, values);
    if (paint(gpuId, values)) changes.add("gpu", [Number(gpuId)]); // its health changed
  }
  if (frame.fleet)
    setText(document.getElementById("fleet-util"), fmtPct(frame.fleet.utilization_percent));
  if (frame.load) showLoad(frame.load);
  const changed = frame.changed || {};
  for (const kind of CARD_KINDS) {
    if (changed[kind]) changes.add(kind, changed[kind]);
  }
  // The tray says what fits now: capacity that changes (a layout, a cordon, a host) redraws it too.
  if (
    changed.deployment ||
    changed.allocation ||
    changed.partition ||
    changed.gpu ||
    changed.host
  ) {
    changes.tray = true;
    changes.flush();
  }
});
/**
 * Says when the servers are past their capacity and telemetry is delayed and coarsened
 * (fleet/live/load.py): the frame's `load` level, 0 when all is well.
 * @param {{level: number, name: string, telemetry_interval_s: number | null}} load
 */
function showLoad(load) {
  const banner = /** @type {HTMLElement} */ (document.getElementById("telemetry-load"));
  if (!banner) return;
  if (!load.level) {
    banner.hidden = true;
    return;
  }
  const every = load.telemetry_interval_s ? `every ${load.telemetry_interval_s} s` : "less often";
  setText(
    banner,
    `Telemetry delayed and coarsened: the servers are ${load.name}, so hosts report ${every} ` +
      "and this page updates every second. Heartbeats and changes still go through.",
  );
  banner.hidden = false;
}

live.on("resync", () => {
  changes.all = true;
  changes.flush();
});

hostsBox.addEventListener("hostsdrawn", () => {
  applyFilters(false);
  announceVisible();
});

enableDragAndDrop();
enableDialogs();
followReplicaRates();
observeHosts();
observeLazy();
applyFilters(false);
live.start();
// For bench_fleet_view (fleet/bench/fleet_view.py): the page is wired and about to be painted;
// then the first screen's cards are drawn (at once, unless some of its hosts are drawn lazily).
requestAnimationFrame(() => performance.mark("fleet:useful"));
firstScreenDrawn().then(() => requestAnimationFrame(() => performance.mark("fleet:cards-visible")));
