// @ts-check
// Moving a placed replica, make before break: POST /allocations/{id}/move, then follow the move
// operation (the new copy runs on the target before the old one stops; a failure leaves the old
// copy running), redrawing the cards of both GPUs on the way.
import { api, followWithToasts, toast, toastError } from "../core.js";
import { changes } from "./changes.js";
import { settled } from "./place.js";
import { cardOfPartition, describeTarget } from "./targets.js";

/**
 * @param {number} allocationId
 * @param {string} label the replica, as `name[3]`
 * @param {HTMLElement | null} fromCard the card it leaves
 * @param {{gpu?: number, partition?: number}} target
 * @param {number | null} [gpu] the target's GPU, when known (to name it without its card)
 * @returns {Promise<boolean>} whether the server accepted it
 */
export async function move(allocationId, label, fromCard, target, gpu = null) {
  const card =
    (target.gpu != null ? document.getElementById(`gpu-${target.gpu}`) : null) ||
    cardOfPartition(target.partition);
  const where = describeTarget(card, target, gpu);
  const result = await api("POST", `/api/v1/allocations/${allocationId}/move`, target);
  if (!result.ok) {
    if (card) {
      card.classList.add("refused");
      setTimeout(() => card.classList.remove("refused"), 500);
    }
    toastError(result, `${label} cannot move to ${where}`);
    return false;
  }
  const gpus = [card, fromCard]
    .filter(Boolean)
    .map((c) => Number(/** @type {HTMLElement} */ (c).dataset.gpu));
  card?.classList.add("settling");
  toast(`Moving ${label} to ${where}`, {
    lines: ["The new copy starts there; the old one stops once it runs."],
    timeout: 5000,
  });
  changes.tray = true;
  changes.add("gpu", gpus);
  followWithToasts(result.data, {
    succeeded: `${label} moved to ${where}`,
    failed: `Moving ${label}`,
    noReason: "No reason given.",
    timeout: 5000,
    onEnd: () => settled(card, gpus),
  });
  return true;
}
