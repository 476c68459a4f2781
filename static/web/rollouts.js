// @ts-check
// The layout rollouts page: rows re-rendered by the server when an operation changes; operators
// resume or abort a rollout through the REST API.
import { api, debounce, refreshOnChanges, refreshRows, toast, toastError } from "./core.js";
import { confirmAction } from "./confirm.js";
import "./rollout_form.js";

const body = /** @type {HTMLElement} */ (document.getElementById("rollouts-body"));

const refresh = debounce(() => refreshRows("/ui/rollouts", body, "tr"), 300);

body.addEventListener("click", async (event) => {
  const button = /** @type {HTMLElement | null} */ (
    /** @type {Element} */ (event.target).closest("button[data-action]")
  );
  if (!button) return;
  const id = button.dataset.rollout;
  const action = button.dataset.action;
  if (
    action === "abort" &&
    !(await confirmAction({
      title: `Abort rollout ${id}?`,
      impact:
        "Drains under way finish; no new GPU is drained. GPUs already changed keep their new layout.",
      action: "Abort rollout",
    }))
  )
    return;
  const result = await api("POST", `/api/v1/rollouts/${id}/${action}`, {});
  if (!result.ok) {
    toastError(result, `Could not ${action} rollout ${id}`);
    return;
  }
  toast(`Rollout ${id}: ${action === "abort" ? "aborting" : "resumed"}`, { kind: "ok" });
  refresh();
});

refreshOnChanges((c) => c.operation, refresh);
