// @ts-check
// Placing a deployment: POST /deployments/{id}/place, then follow the operation until the agent
// has applied it (core.followOperation), redrawing the card and the tray on the way.
import { api, followOperation, isFinal, toast, toastError } from "../core.js";
import { changes } from "./changes.js";
import { cardOfPartition, describeTarget } from "./targets.js";

/**
 * @param {number} deploymentId
 * @param {string} name
 * @param {{gpu?: number, partition?: number}} target
 * @returns {Promise<boolean>} whether the server accepted it
 */
export async function place(deploymentId, name, target) {
  const card = (target.gpu != null ? document.getElementById(`gpu-${target.gpu}`) : null)
    || cardOfPartition(target.partition);
  const where = describeTarget(card, target);
  const result = await api("POST", `/api/v1/deployments/${deploymentId}/place`, target);
  if (!result.ok) {
    if (card) { card.classList.add("refused"); setTimeout(() => card.classList.remove("refused"), 500); }
    toastError(result, `${name} does not fit on ${where}`);
    return false;
  }
  const gpus = card ? [Number(card.dataset.gpu)] : [];
  card?.classList.add("settling");
  toast(`Placing ${name} on ${where}`, { lines: ["Waiting for the agent to apply it…"], timeout: 4000 });
  changes.tray = true;
  changes.add("gpu", gpus);
  followOperation(result.data, (operation) => {
    if (!isFinal(operation.status)) return;
    if (card) document.getElementById(card.id)?.classList.remove("settling");
    changes.tray = true;
    changes.add("gpu", gpus);
    if (operation.status === "succeeded") toast(`${name} is running on ${where}`, { kind: "ok", timeout: 4000 });
    else toast(`Placing ${name} ${operation.status}`, { kind: "error", lines: [operation.reason || "No reason given."], timeout: 10000 });
  });
  return true;
}
