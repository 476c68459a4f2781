// @ts-check
// Host groups drawn as they scroll into view. On a large fleet the server renders the first
// screen's cards and, for every other host, its summary header over a labelled placeholder
// (`section.host[data-lazy]`); this module fetches the cards of the hosts coming into view, a
// batch at a time, from /ui/cards (the fragment the live changes use), with the form's filters,
// so a search draws exactly what the server matched.
import { debounce, fragment } from "../core.js";
import { forgetHost, observeHosts, paint } from "./paint.js";
import { drag, hostsBox, latest } from "./state.js";
import { markCard } from "./targets.js";

const BATCH = 16; // hosts per request: about 128 cards
const form = /** @type {HTMLFormElement} */ (document.getElementById("filters"));

/** Whether this page draws its host groups as they scroll into view. */
export function lazyPage() {
  return hostsBox.hasAttribute("data-lazy");
}

/** The form's filters with a value, as query parameters (the server's meaning applies). */
export function filterParams() {
  const params = new URLSearchParams();
  for (const [name, value] of new FormData(form)) {
    if (String(value).trim()) params.set(name, String(value).trim());
  }
  return params;
}

/** @type {Set<string>} host ids in (or near) view, not drawn yet */
const queued = new Set();
let generation = 0; // bumped when the host list is replaced: answers for the old one are dropped
let running = false;

const observer = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      const id = /** @type {HTMLElement} */ (entry.target).dataset.host || "";
      if (entry.isIntersecting) queued.add(id);
      else queued.delete(id);
    }
    drawSoon();
  },
  { rootMargin: "600px 0px" },
);

const drawSoon = debounce(drawQueued, 30);

async function drawQueued() {
  if (running) return;
  running = true;
  try {
    while (queued.size) {
      const ids = [...queued].slice(0, BATCH);
      ids.forEach((id) => queued.delete(id));
      await drawHosts(ids);
    }
  } finally {
    running = false;
  }
}

/**
 * Draws these hosts' cards in place of their placeholders (the filters' matches only).
 * @param {string[]} ids
 */
async function drawHosts(ids) {
  const mine = generation;
  const params = filterParams();
  params.set("host", ids.join(","));
  params.set("drawn", ids.join(","));
  let content;
  try {
    content = await fragment(`/ui/cards?${params}`);
  } catch {
    return;
  }
  if (mine !== generation) return;
  const answered = new Set();
  for (const section of /** @type {NodeListOf<HTMLElement>} */ (
    content.querySelectorAll("section.host")
  )) {
    answered.add(section.dataset.host);
    const old = document.getElementById(section.id);
    if (!old || !old.hasAttribute("data-lazy")) continue; // drawn meanwhile, or gone
    replace(old, section);
  }
  for (const id of ids) {
    // no GPU of the host matches any more: nothing to draw
    const old = document.getElementById(`host-${id}`);
    if (!answered.has(id) && old && old.hasAttribute("data-lazy")) {
      observer.unobserve(old);
      old.remove();
    }
  }
  hostsBox.dispatchEvent(new CustomEvent("hostsdrawn"));
}

/** @param {HTMLElement} old @param {HTMLElement} section */
function replace(old, section) {
  observer.unobserve(old);
  forgetHost(old);
  old.replaceWith(section);
  observeHosts(section);
  for (const card of /** @type {NodeListOf<HTMLElement>} */ (
    section.querySelectorAll("article.gpu")
  )) {
    const id = /** @type {string} */ (card.dataset.gpu);
    const t = latest.get(id);
    if (t) paint(id, t);
    if (drag.current && drag.current.targets) markCard(card, drag.current.targets.get(Number(id)));
  }
}

/** Watches the undrawn host groups under `root` (or `root` itself). */
export function observeLazy(root = hostsBox) {
  if (root.matches("section.host[data-lazy]")) observer.observe(root);
  for (const host of root.querySelectorAll("section.host[data-lazy]")) observer.observe(host);
}

/** Forgets every host group watched (their list is being replaced). */
export function resetLazy() {
  generation += 1;
  queued.clear();
  observer.disconnect();
}

/** The host ids whose cards are drawn (the live changes re-render only theirs). */
export function drawnHostIds() {
  return [...hostsBox.querySelectorAll("section.host:not([data-lazy])")].map(
    (host) => /** @type {HTMLElement} */ (host).dataset.host,
  );
}

/** Resolves once the host groups on the first screen have their cards drawn. */
export function firstScreenDrawn() {
  return new Promise((resolve) => {
    const onScreen = () =>
      [...hostsBox.querySelectorAll("section.host[data-lazy]")].some(
        (host) => host.getBoundingClientRect().top < innerHeight,
      );
    if (!onScreen()) {
      resolve(undefined);
      return;
    }
    const check = () => {
      if (onScreen()) return;
      hostsBox.removeEventListener("hostsdrawn", check);
      resolve(undefined);
    };
    hostsBox.addEventListener("hostsdrawn", check);
  });
}
