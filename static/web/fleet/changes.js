// @ts-check
// Changes: re-render the affected cards and the tray from the server (the markup stays the
// server's), keeping what is on screen in place. On a fleet drawn as it scrolls, only the drawn
// hosts' cards are re-rendered; the others' summary headers are.
import { debounce, fragment, swap } from "../core.js";
import { applyFilters, reloadHosts, serverFiltered } from "./filters.js";
import { drawnHostIds, observeLazy } from "./lazy.js";
import { observeHosts, paint, setText } from "./paint.js";
import { drag, hostsBox, latest } from "./state.js";
import { markCard } from "./targets.js";

/** What changed since the last refresh, gathered for one request per kind. */
export const changes = {
  /** @type {Object<string, Set<number>>} */
  pending: { gpu: new Set(), partition: new Set(), allocation: new Set(), host: new Set() },
  tray: false,
  all: false,
  /** Changes that came in during a drag, applied once it ends. */
  held: false,
  /** @param {string} kind @param {number[]} ids */
  add(kind, ids) {
    if (kind in this.pending) ids.forEach((id) => this.pending[kind].add(id));
    this.flush();
  },
  flush: debounce(() => changes.run(), 80),
  async run() {
    // Never redraw a card under the pointer during a drag: a swapped source card cancels the
    // gesture (its dragend never reaches us) and a swapped target can swallow the drop.
    if (drag.current) {
      this.held = true;
      return;
    }
    const all = this.all;
    const params = new URLSearchParams();
    for (const [kind, ids] of Object.entries(this.pending)) {
      if (ids.size) params.set(kind, [...ids].join(","));
      ids.clear();
    }
    this.all = false;
    if (all && serverFiltered())
      await reloadHosts(); // the groups the filters show, afresh
    else if (all) params.set("all", "1");
    if ([...params.keys()].length) {
      if (serverFiltered()) params.set("drawn", drawnHostIds().join(","));
      await refreshCards(params);
    }
    if (this.tray || all) {
      this.tray = false;
      await refreshTray();
    }
  },
};

/** @param {URLSearchParams} params */
async function refreshCards(params) {
  let content;
  try {
    content = await fragment(`/ui/cards?${params}`);
  } catch {
    return;
  }
  for (const section of /** @type {NodeListOf<HTMLElement>} */ (
    content.querySelectorAll("section.host")
  )) {
    const existing = document.getElementById(section.id);
    if (!existing) {
      hostsBox.append(section);
      observeHosts(section);
      observeLazy(section);
      continue;
    }
    swapHead(existing, section);
    if (existing.hasAttribute("data-lazy") || section.hasAttribute("data-lazy")) continue;
    const grid = /** @type {HTMLElement} */ (existing.querySelector(".gpus"));
    for (const card of /** @type {HTMLElement[]} */ ([
      ...section.querySelectorAll("article.gpu"),
    ])) {
      const old = document.getElementById(card.id);
      if (old) {
        if (swap(old, card)) afterSwap(card);
      } else {
        grid.append(card);
        afterSwap(card);
      }
    }
  }
  applyFilters(false);
}

/** @param {HTMLElement} existing @param {HTMLElement} section */
function swapHead(existing, section) {
  const oldHead = existing.querySelector(".host-head");
  const newHead = section.querySelector(".host-head");
  if (oldHead && newHead && oldHead.innerHTML !== newHead.innerHTML) oldHead.replaceWith(newHead);
  existing.className = section.className;
}

/** @param {HTMLElement} card */
function afterSwap(card) {
  const id = /** @type {string} */ (card.dataset.gpu);
  const t = latest.get(id);
  if (t) paint(id, t);
  if (drag.current && drag.current.targets) markCard(card, drag.current.targets.get(Number(id)));
  card.classList.add("flash");
  setTimeout(() => card.classList.remove("flash"), 1300);
}

/** Re-reads the tray, unless a deployment is being dragged (then once the drag ends). */
export async function refreshTray() {
  if (drag.current) {
    changes.tray = true;
    return;
  } // never pull the card from under the pointer
  let content;
  const team = document.getElementById("tray")?.dataset.team;
  try {
    content = await fragment(team ? `/ui/tray?team=${encodeURIComponent(team)}` : "/ui/tray");
  } catch {
    return;
  }
  const fresh = content.querySelector("#tray-list");
  const old = document.getElementById("tray-list");
  if (!fresh || !old) return;
  /** @param {Element} root */
  const sigs = (root) =>
    [...root.querySelectorAll(".dep")]
      .map((d) => d.id + /** @type {HTMLElement} */ (d).dataset.sig)
      .join();
  if (sigs(old) === sigs(fresh)) return;
  const focused = document.activeElement && document.activeElement.closest(".dep");
  const before = new Map(
    [...old.querySelectorAll(".dep")].map((d) => [
      d.id,
      /** @type {HTMLElement} */ (d).dataset.sig,
    ]),
  );
  old.replaceWith(fresh);
  for (const dep of /** @type {NodeListOf<HTMLElement>} */ (fresh.querySelectorAll(".dep"))) {
    if (before.has(dep.id) && before.get(dep.id) !== dep.dataset.sig) dep.classList.add("settled");
  }
  setText(
    document.querySelector(".tray-head .count"),
    String(fresh.querySelectorAll(".dep").length),
  );
  if (focused) /** @type {HTMLElement | null} */ (document.getElementById(focused.id))?.focus();
}
