// @ts-check
// Filters and search. What each filter means is the server's (fleet/inventory/filters.py, sent as
// `config.gpu_filters`): on a fleet small enough to be drawn whole this module applies its match
// kinds to the data-* attribute the server renders on each card; on a larger one (drawn as it
// scrolls, fleet/lazy.js) the server matches across the whole fleet and sends the host groups
// to draw, and the cards already drawn are still matched here as live changes redraw them.
import { config, debounce, fragment } from "../core.js";
import { filterParams, lazyPage, observeLazy, resetLazy } from "./lazy.js";
import { setText, announceVisible, observeHosts, paint } from "./paint.js";
import { hostsBox, latest } from "./state.js";

/**
 * @typedef {{name: string, label: string, match: "terms" | "exact" | "contains" | "flag",
 *   choices: string[][], attr: string}} GpuFilter
 */

/** @type {GpuFilter[]} */
const FILTERS = config.gpu_filters || [];
const form = /** @type {HTMLFormElement} */ (document.getElementById("filters"));
const TRUE = ["true", "1"];
const FALSE = ["false", "0"];

/** @type {Object<string, (have: string, want: string, filter: GpuFilter) => boolean>} */
const MATCH = {
  terms: (have, want) =>
    want
      .toLowerCase()
      .split(/\s+/)
      .filter(Boolean)
      .every((term) => have.toLowerCase().includes(term)),
  exact: (have, want, filter) => have === want || !filter.choices.some(([value]) => value === want),
  contains: (have, want) => have.toLowerCase().includes(want.toLowerCase()),
  flag: (have, want) => {
    const value = want.toLowerCase();
    if (TRUE.includes(value)) return have === "1";
    if (FALSE.includes(value)) return have === "0";
    return true; // not a flag value: the server ignores it too
  },
};

/**
 * The filters a set of parameters chooses: [filter, value] for each one with a value.
 * @param {URLSearchParams | FormData} params
 * @returns {[GpuFilter, string][]}
 */
function chosen(params) {
  return FILTERS.map(
    (f) => /** @type {[GpuFilter, string]} */ ([f, String(params.get(f.name) || "").trim()]),
  ).filter(([, value]) => value);
}

/**
 * Whether a card passes every chosen filter, by the server's rules.
 * @param {HTMLElement} card
 * @param {[GpuFilter, string][]} filters
 */
export function matches(card, filters) {
  return filters.every(([f, want]) => MATCH[f.match](card.dataset[f.attr] ?? "", want, f));
}

/** Shows the cards (and hosts) that pass the form's filters; keeps the URL in step. */
export function applyFilters(updateUrl = true) {
  const filters = chosen(new FormData(form));
  let shown = 0;
  let total = 0;
  for (const host of /** @type {NodeListOf<HTMLElement>} */ (
    hostsBox.querySelectorAll("section.host")
  )) {
    if (host.hasAttribute("data-lazy")) continue; // not drawn: the server matched its GPUs
    let any = false;
    for (const card of /** @type {NodeListOf<HTMLElement>} */ (
      host.querySelectorAll("article.gpu")
    )) {
      const ok = matches(card, filters);
      total += 1;
      if (ok) {
        shown += 1;
        any = true;
      }
      if (card.hidden === ok) card.hidden = !ok;
    }
    if (host.hidden === any) host.hidden = !any;
  }
  if (serverFiltered()) {
    // fleet-wide counts, from the server's match
    shown = Number(hostsBox.dataset.shown);
    total = Number(hostsBox.dataset.total);
  }
  setText(
    document.getElementById("match-count"),
    shown === total ? `${total} GPUs` : `${shown} of ${total} GPUs`,
  );
  if (updateUrl) {
    const params = new URLSearchParams(filters.map(([f, value]) => [f.name, value]));
    history.replaceState(null, "", params.toString() ? `?${params}` : location.pathname);
    announceVisible();
  }
}

/** Whether the server matches the filters (a fleet too large to be drawn whole). */
export function serverFiltered() {
  return lazyPage() || Number(hostsBox.dataset.total) > Number(hostsBox.dataset.lazyAfter);
}

let asked = 0; // the latest search sent: older answers are dropped

/** Replaces the host groups by the server's for the form's filters (the whole fleet matched). */
export async function reloadHosts() {
  const mine = ++asked;
  let content;
  try {
    content = await fragment(`/ui/hosts?${filterParams()}`);
  } catch {
    return;
  }
  const fresh = /** @type {HTMLElement | null} */ (content.querySelector("#hosts"));
  if (!fresh || mine !== asked) return;
  resetLazy();
  for (const name of ["data-total", "data-shown", "data-lazy-after", "data-lazy"]) {
    const value = fresh.getAttribute(name);
    if (value === null) hostsBox.removeAttribute(name);
    else hostsBox.setAttribute(name, value);
  }
  hostsBox.replaceChildren(...fresh.childNodes);
  observeHosts();
  observeLazy();
  for (const [id, t] of latest) paint(id, t);
}

// A page the server filtered holds only the matching cards: the first change loads them all.
let loadedAll = chosen(new URLSearchParams(location.search)).length === 0;

async function onFilterInput() {
  if (serverFiltered()) {
    await reloadHosts();
  } else if (!loadedAll) {
    loadedAll = true;
    const content = await fragment("/ui/cards?all=1");
    hostsBox.replaceChildren(content);
    observeHosts();
    for (const [id, t] of latest) paint(id, t);
  }
  applyFilters();
}

form.addEventListener("input", debounce(onFilterInput, serverFiltered() ? 250 : 60));
form.addEventListener("submit", (e) => {
  e.preventDefault();
  onFilterInput();
});
document.addEventListener("keydown", (e) => {
  const target = /** @type {HTMLElement} */ (e.target);
  if (e.key === "/" && !target.closest("input, textarea, select, dialog")) {
    e.preventDefault();
    document.getElementById("search")?.focus();
  }
});
