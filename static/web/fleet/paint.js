// @ts-check
// Telemetry on the cards (touching only the nodes whose value changed), and which GPUs are on
// screen: the socket only sends their telemetry.
import { debounce, fmtMiBPair, fmtNum, fmtPct, heatBucket, live, naTitle } from "../core.js";
import { hostsBox } from "./state.js";

const NA = naTitle();

/** @typedef {import("./state.js").Telemetry} Telemetry */

/** @type {WeakMap<Element, any>} */
const refsCache = new WeakMap();
/** @param {Element} card */
function refs(card) {
  let found = refsCache.get(card);
  if (!found) {
    const slices = new Map();
    for (const node of card.querySelectorAll(".slice[data-partition]")) {
      slices.set(/** @type {HTMLElement} */ (node).dataset.partition, {
        node,
        pu: node.querySelector('[data-live="pu"]'),
      });
    }
    found = {
      util: card.querySelector('[data-live="util"]'),
      mem: card.querySelector('[data-live="mem"]'),
      temp: card.querySelector('[data-live="temp"]'),
      power: card.querySelector('[data-live="power"]'),
      memline: card.querySelector('[data-live="memline"]'),
      slices,
    };
    refsCache.set(card, found);
  }
  return found;
}

/** @param {Element | null} node @param {string} text */
export function setText(node, text) {
  if (node && node.textContent !== text) node.textContent = text;
}

/**
 * Paints one GPU's telemetry on its card. Returns true when the telemetry reports a health the
 * card does not show yet (the caller re-renders the card).
 * @param {string} gpuId
 * @param {Telemetry} t
 * @returns {boolean}
 */
export function paint(gpuId, t) {
  const card = document.getElementById(`gpu-${gpuId}`);
  if (!card) return false;
  const r = refs(card);
  const heat = heatBucket(t.utilization_percent);
  if (card.dataset.heat !== heat) card.dataset.heat = heat;
  setText(r.util, fmtPct(t.utilization_percent));
  const total = t.memory_total_mib ?? Number(card.dataset.memTotal);
  setText(r.mem, fmtMiBPair(t.memory_used_mib, total));
  setText(r.temp, fmtNum(t.temperature_c, "°C"));
  setText(r.power, fmtNum(t.power_w, " W"));
  if (r.memline && t.memory_used_mib != null && total) {
    r.memline.style.width = `${Math.min(100, (100 * t.memory_used_mib) / total).toFixed(1)}%`;
  }
  for (const [pid, values] of Object.entries(t.partitions || {})) {
    const slice = r.slices.get(pid);
    if (!slice) continue;
    const sliceHeat = heatBucket(values.utilization_percent);
    if (slice.node.dataset.heat !== sliceHeat) {
      slice.node.dataset.heat = sliceHeat;
      const base = slice.node.title.split(" · utilisation:")[0];
      slice.node.title = sliceHeat === "na" ? `${base} · utilisation: ${NA}` : base;
    }
    if (slice.pu) setText(slice.pu, fmtPct(values.utilization_percent));
  }
  return Boolean(t.health && card.dataset.health && t.health !== card.dataset.health);
}

// ---- which GPUs are on screen ---------------------------------------------------------------

/** @type {Set<Element>} */
const visibleHosts = new Set();

/** Tells the socket which GPUs to send telemetry for: the shown cards of hosts on screen. */
export const announceVisible = debounce(() => {
  const ids = [];
  for (const host of visibleHosts) {
    for (const card of host.querySelectorAll(".gpu:not([hidden])")) {
      ids.push(Number(/** @type {HTMLElement} */ (card).dataset.gpu));
    }
  }
  live.subscribe(ids);
}, 150);

const observer = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      if (entry.isIntersecting) visibleHosts.add(entry.target);
      else visibleHosts.delete(entry.target);
    }
    announceVisible();
  },
  { rootMargin: "300px 0px" },
);

/** Stops watching a host section (replaced by its drawn cards). @param {Element} host */
export function forgetHost(host) {
  observer.unobserve(host);
  visibleHosts.delete(host);
}

/** Watches whether each host section under `root` (or `root` itself) is on screen. */
export function observeHosts(root = hostsBox) {
  if (root.matches("section.host")) observer.observe(root);
  for (const host of root.querySelectorAll("section.host")) observer.observe(host);
}
