// @ts-check
// Drag-and-drop placement: dragging a tray deployment marks every card with the server's fit
// preview; the drop places it (the server checks the fit again). Dragging a placed replica off
// its slice moves it, make before break.
import { canDeploy, toast } from "../core.js";
import { changes, refreshTray } from "./changes.js";
import { move } from "./move.js";
import { place } from "./place.js";
import { drag, hostsBox, trayBox } from "./state.js";
import { clearMarks, loadTargets, markCard, targetFor } from "./targets.js";

/** @param {HTMLElement} dep a tray deployment, or a placed replica (`data-allocation`) */
function startDrag(dep) {
  const id = Number(dep.dataset.deployment);
  drag.current = { id, name: dep.dataset.name || "", targets: null };
  if (dep.dataset.allocation) {
    drag.current.allocation = Number(dep.dataset.allocation);
    drag.current.from = /** @type {HTMLElement | null} */ (dep.closest("article.gpu"));
  }
  document.body.classList.add("dragging");
  dep.classList.add("is-dragging");
  loadTargets(id).then((targets) => {
    if (!drag.current || drag.current.id !== id) return;
    drag.current.targets = targets;
    if (!targets) {
      toast("No fit preview", {
        lines: ["The server will check the fit when you drop."],
        timeout: 2500,
      });
      return;
    }
    for (const card of /** @type {NodeListOf<HTMLElement>} */ (
      hostsBox.querySelectorAll("article.gpu:not([hidden])")
    )) {
      markCard(card, targets.get(Number(card.dataset.gpu)));
    }
  });
}

function endDrag() {
  document.body.classList.remove("dragging");
  for (const node of document.querySelectorAll(".is-dragging"))
    node.classList.remove("is-dragging");
  clearMarks();
  drag.current = null;
  if (changes.held) {
    changes.held = false;
    changes.flush();
  } else if (changes.tray) refreshTray();
}

/** @param {Event} e @param {string} selector @returns {HTMLElement | null} */
const closest = (e, selector) => {
  const target = /** @type {Element | null} */ (e.target);
  return target && target.closest
    ? /** @type {HTMLElement | null} */ (target.closest(selector))
    : null;
};

/** Wires the tray and the cards for dragging (operators only). */
export function enableDragAndDrop() {
  if (!canDeploy) return;
  trayBox.addEventListener("dragstart", (e) => {
    const dep = closest(e, '.dep[draggable="true"]');
    if (!dep || !e.dataTransfer) return;
    e.dataTransfer.setData("text/plain", `fleet-deployment:${dep.dataset.deployment}`);
    e.dataTransfer.effectAllowed = "move";
    startDrag(dep);
  });
  // However the gesture ends (dropped anywhere, Escape, a source that left the page), the
  // cards and tray held back during it are redrawn.
  document.addEventListener("dragend", () => {
    if (drag.current) endDrag();
  });
  hostsBox.addEventListener("dragstart", (e) => {
    const replica = closest(e, '[data-allocation][draggable="true"]');
    if (!replica || !e.dataTransfer) return;
    e.dataTransfer.setData("text/plain", `fleet-allocation:${replica.dataset.allocation}`);
    e.dataTransfer.effectAllowed = "move";
    startDrag(replica);
  });

  /** @type {HTMLElement | null} */
  let hovered = null;
  // A card accepts the drop from the moment the pointer enters it (dragenter), not only once
  // a dragover has come: a drop straight after entering is still a drop.
  hostsBox.addEventListener("dragenter", (e) => {
    if (drag.current && closest(e, "article.gpu")) e.preventDefault();
  });
  hostsBox.addEventListener("dragover", (e) => {
    if (!drag.current) return;
    const card = closest(e, "article.gpu");
    if (!card) return;
    e.preventDefault();
    if (e.dataTransfer) e.dataTransfer.dropEffect = "move";
    const slice = closest(e, ".slice[data-partition]");
    const target = slice || card;
    if (hovered !== target) {
      hovered?.classList.remove("drop-hover");
      card.classList.add("drop-hover");
      if (slice) slice.classList.add("drop-hover");
      hovered = target;
    }
  });
  hostsBox.addEventListener("dragleave", (e) => {
    const card = closest(e, "article.gpu");
    const into = /** @type {Node | null} */ (e.relatedTarget);
    if (card && !card.contains(into)) card.classList.remove("drop-hover");
    if (hovered && !hovered.contains(into)) {
      hovered.classList.remove("drop-hover");
      hovered = null;
    }
  });
  hostsBox.addEventListener("drop", async (e) => {
    if (!drag.current) return;
    const card = closest(e, "article.gpu");
    if (!card) return;
    e.preventDefault();
    const { id, name, targets, allocation, from } = drag.current;
    const slice = closest(e, ".slice[data-partition]");
    if (allocation != null && slice && slice.querySelector(`[data-allocation="${allocation}"]`)) {
      endDrag(); // dropped back where it runs
      return;
    }
    const target = targetFor(card, slice, targets);
    endDrag();
    if (allocation != null) await move(allocation, name, from || null, target);
    else await place(id, name, target, card);
  });
}
