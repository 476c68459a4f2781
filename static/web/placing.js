// @ts-check
// Place all, Place… and Move… away from the fleet view: on the deployments list and a
// deployment's page. The dialog lists every GPU with the same fit preview the drag shows
// (GET /deployments/{id}/targets), by name, with the reason a GPU does not fit; the choice goes to
// the REST API (place, place-all, move) and is followed until the agent has applied it. The live
// updates redraw the rows.
import { api, el, followWithToasts, toast, toastError } from "./core.js";
import { describeTarget, fitNote, loadTargets, refusalList } from "./fleet/targets.js";
import { gpuName, reasonText } from "./names.js";

/** @type {HTMLDialogElement | null} */
let dialog = null;

function targetDialog() {
  if (dialog) return dialog;
  dialog = /** @type {HTMLDialogElement} */ (
    el(
      "dialog",
      { class: "dialog", id: "target-dialog", "aria-labelledby": "target-title" },
      el(
        "form",
        { method: "dialog" },
        el(
          "header",
          {},
          el("h2", { id: "target-title" }),
          el("button", { class: "btn ghost small", value: "cancel", "aria-label": "Close" }, "✕"),
        ),
        el("p", { class: "muted small", id: "target-sub" }),
        el("div", { class: "targets", id: "target-list" }),
      ),
    )
  );
  document.body.append(dialog);
  return dialog;
}

/**
 * @param {{id: number, name: string, request?: string, allocation?: number | null,
 *   label?: string}} what a deployment to place, or one of its replicas (`allocation`) to move
 * @param {HTMLElement | null} [back] where focus returns
 */
export async function openTargets(what, back = null) {
  const box = targetDialog();
  const moving = what.allocation != null;
  const title = moving ? `Move ${what.label || what.name}` : `Place ${what.name}`;
  /** @type {HTMLElement} */ (box.querySelector("#target-title")).textContent = title;
  /** @type {HTMLElement} */ (box.querySelector("#target-sub")).textContent = what.request || "";
  const list = /** @type {HTMLElement} */ (box.querySelector("#target-list"));
  list.replaceChildren(
    el("p", { class: "muted small" }, el("span", { class: "spinner" }), " Checking every GPU…"),
  );
  box.showModal();
  const targets = await loadTargets(what.id);
  if (!targets) {
    list.replaceChildren(el("p", { class: "form-error", text: "The server has no fit preview." }));
    return;
  }
  /** @param {{gpu?: number, partition?: number}} target @param {number} gpu */
  const choose = async (target, gpu) => {
    box.close();
    const where = describeTarget(null, target, gpu);
    if (moving)
      await moveTo(/** @type {number} */ (what.allocation), what.label || "", target, where);
    else await placeOn(what.id, what.name, target, where);
    back?.focus();
  };
  list.replaceChildren(...rows(targets, choose, moving ? "Move here" : "Place here"));
  list.querySelector("button")?.focus();
}

/**
 * @param {Map<number, import("./fleet/state.js").TargetInfo>} targets
 * @param {(target: {gpu?: number, partition?: number}, gpu: number) => void} choose
 * @param {string} verb
 */
function rows(targets, choose, verb) {
  const fits = [...targets].filter(([, i]) => i.fit);
  fits.sort(([, a], [, b]) => (b.best?.score ?? 0) - (a.best?.score ?? 0));
  const found = [el("h3", { text: `Fits (${fits.length})` })];
  if (!fits.length) found.push(el("p", { class: "muted small", text: "No GPU can take it now." }));
  for (const [rank, [gpu, info]] of fits.slice(0, 50).entries()) {
    const target = info.gpuFeasible ? { gpu } : { partition: info.best.partition };
    found.push(
      el(
        "div",
        { class: "target" },
        el(
          "div",
          {},
          el("div", { class: "where", text: describeTarget(null, target, gpu) }),
          el("div", { class: "score", text: fitNote(info) + (rank === 0 ? " · best fit" : "") }),
        ),
        el(
          "button",
          {
            type: "button",
            class: "btn small primary",
            "data-gpu": gpu,
            onclick: () => choose(target, gpu),
          },
          verb,
        ),
      ),
    );
  }
  found.push(...refusalList(targets));
  return found;
}

/** @param {number} id @param {string} name @param {{gpu?: number, partition?: number}} target @param {string} where */
async function placeOn(id, name, target, where) {
  const result = await api("POST", `/api/v1/deployments/${id}/place`, target);
  if (!result.ok) {
    toastError(result, `${name} does not fit on ${where}`);
    return;
  }
  toast(`Placing ${name} on ${where}`, { lines: ["Waiting for the agent to apply it…"] });
  followWithToasts(result.data, {
    succeeded: `${name} is placed on ${where}`,
    failed: `Placing ${name}`,
    noReason: "No reason given.",
  });
}

/** @param {number} allocation @param {string} label @param {{gpu?: number, partition?: number}} target @param {string} where */
async function moveTo(allocation, label, target, where) {
  const result = await api("POST", `/api/v1/allocations/${allocation}/move`, target);
  if (!result.ok) {
    toastError(result, `${label} cannot move to ${where}`);
    return;
  }
  toast(`Moving ${label} to ${where}`, {
    lines: ["The new copy starts there; the old one stops once it runs."],
  });
  followWithToasts(result.data, {
    succeeded: `${label} moved to ${where}`,
    failed: `Moving ${label}`,
    noReason: "No reason given.",
  });
}

/** Places every replica that fits now. @param {number} id @param {string} name @param {HTMLButtonElement} button */
export async function placeAll(id, name, button) {
  button.disabled = true;
  const result = await api("POST", `/api/v1/deployments/${id}/place-all`, {});
  button.disabled = false;
  if (!result.ok) {
    toastError(result, `Could not place ${name}`);
    return;
  }
  const { placed, unplaced, reasons } = result.data;
  const left = unplaced
    ? [`${unplaced} left unplaced: ${reasons[0] ? reasonText(reasons[0]) : "no capacity"}`]
    : [];
  toast(`Placing ${placed.length} replica(s) of ${name}`, {
    kind: unplaced ? "warn" : "ok",
    lines: ["Waiting for the agents to apply them…", ...left],
  });
}

/**
 * Wires the `[data-action]` buttons (place-all, place, move) under `root`; the deployment is the
 * closest `[data-deployment]` (its `data-name`, `data-request`), a replica its
 * `[data-allocation-id]` row.
 * @param {HTMLElement} root
 */
export function wirePlacing(root) {
  root.addEventListener("click", (e) => {
    const button = /** @type {HTMLButtonElement | null} */ (
      /** @type {Element} */ (e.target).closest("button[data-action]")
    );
    const holder = /** @type {HTMLElement | null} */ (button?.closest("[data-deployment]"));
    if (!button || !holder) return;
    const id = Number(holder.dataset.deployment);
    const name = holder.dataset.name || "";
    const request = holder.dataset.request || "";
    if (button.dataset.action === "place-all") placeAll(id, name, button);
    else if (button.dataset.action === "place") openTargets({ id, name, request }, button);
    else if (button.dataset.action === "move") {
      const row = /** @type {HTMLElement | null} */ (button.closest("[data-allocation-id]"));
      if (!row) return;
      const allocation = Number(row.dataset.allocationId);
      const label = `${name}[${row.dataset.replica}]`;
      openTargets({ id, name, request, allocation, label }, button);
    }
  });
}
