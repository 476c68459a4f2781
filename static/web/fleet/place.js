// @ts-check
// Placing a deployment: POST /deployments/{id}/place, then follow the operation until the agent
// has applied it (core.followOperation), redrawing the card and the tray on the way.
import { api, followWithToasts, toast, toastError } from "../core.js";
import { changes } from "./changes.js";
import { cardOfPartition, describeTarget } from "./targets.js";

/**
 * @param {number} deploymentId
 * @param {string} name
 * @param {{gpu?: number, partition?: number}} target
 * @param {HTMLElement | null} [dropped] the GPU card it was dropped on, when it was
 * @param {number | null} [gpu] the target's GPU, when known (to name it without its card)
 * @returns {Promise<boolean>} whether the server accepted it
 */
export async function place(deploymentId, name, target, dropped = null, gpu = null) {
  const card =
    dropped ||
    (target.gpu != null ? document.getElementById(`gpu-${target.gpu}`) : null) ||
    cardOfPartition(target.partition);
  const where = describeTarget(card, target, gpu);
  const result = await api("POST", `/api/v1/deployments/${deploymentId}/place`, target);
  if (!result.ok) {
    if (card) {
      card.classList.add("refused");
      setTimeout(() => card.classList.remove("refused"), 500);
    }
    toastError(result, `${name} does not fit on ${where}`);
    return false;
  }
  const gpus = card ? [Number(card.dataset.gpu)] : [];
  card?.classList.add("settling");
  toast(`Placing ${name} on ${where}`, {
    lines: ["Waiting for the agent to apply it…"],
    timeout: 4000,
  });
  changes.tray = true;
  changes.add("gpu", gpus);
  followWithToasts(result.data, {
    succeeded: `${name} is running on ${where}`,
    failed: `Placing ${name}`,
    noReason: "No reason given.",
    timeout: 4000,
    onEnd: () => settled(card, gpus),
  });
  return true;
}

/**
 * A placement or move is over: its target card stops settling; its GPUs' cards and the tray
 * redraw.
 * @param {HTMLElement | null} card
 * @param {number[]} gpus
 */
export function settled(card, gpus) {
  if (card) document.getElementById(card.id)?.classList.remove("settling");
  changes.tray = true;
  changes.add("gpu", gpus);
}
