// @ts-check
// The one confirm dialog of every destructive action (drain, scale-down of running replicas,
// delete, evict, rollout abort): it names the action, states its impact in a sentence ("3
// running replicas stop") and answers true only when the user presses the action's own button.
// Cancel has the focus, so Enter or Escape never destroy anything by accident.
import { el } from "./core.js";

/**
 * Ask before a destructive action.
 * @param {{title: string, impact: string, action: string, details?: string[]}} what
 * @returns {Promise<boolean>}
 */
export function confirmAction({ title, impact, action, details = [] }) {
  const cancel = el("button", { type: "button", class: "btn", "data-confirm": "cancel" }, "Cancel");
  const go = el("button", { type: "button", class: "btn danger", "data-confirm": "ok" }, action);
  const dialog = /** @type {HTMLDialogElement} */ (
    el(
      "dialog",
      {
        class: "dialog confirm-dialog",
        role: "alertdialog",
        "aria-labelledby": "confirm-title",
        "aria-describedby": "confirm-impact",
      },
      el(
        "form",
        { method: "dialog" },
        el("header", {}, el("h2", { id: "confirm-title", text: title })),
        el("p", { id: "confirm-impact", class: "confirm-impact", text: impact }),
        details.length
          ? el("ul", { class: "muted small" }, ...details.map((d) => el("li", { text: d })))
          : null,
        el("footer", {}, cancel, go),
      ),
    )
  );
  document.body.append(dialog);
  return new Promise((resolve) => {
    let answer = false;
    cancel.addEventListener("click", () => dialog.close());
    go.addEventListener("click", () => {
      answer = true;
      dialog.close();
    });
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(answer);
    });
    dialog.showModal();
    cancel.focus();
  });
}
