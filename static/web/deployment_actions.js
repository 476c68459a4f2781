// @ts-check
// A deployment's operator actions: a rolling update to a new workload, the defrag proposal and
// its Apply, handing it to another team, and deleting it. Each calls the REST API and follows the operation it starts.
import { api, el, followWithToasts, toast, toastError } from "./core.js";
import { confirmAction } from "./confirm.js";
import { WORKLOAD_FIELDS, fillWorkload, syncWorkload, workloadBody } from "./workload_form.js";
import { gpuName, learnGpuNames } from "./names.js";

const section = document.getElementById("dep-actions");
const page = /** @type {HTMLElement} */ (document.getElementById("deployment-page"));
const deploymentId = Number(page.dataset.deployment);
const name = section?.dataset.name || "";

/** Follow an operation, toasting its start and its outcome. @param {any} operation @param {string} what */
function follow(operation, what) {
  toast(what, { lines: [operation.summary || ""], timeout: 5000 });
  followWithToasts(operation, { succeeded: `${what}: succeeded`, failed: `${what}:` });
}

function wireRollout() {
  const form = /** @type {HTMLFormElement | null} */ (document.getElementById("rollout-form"));
  if (!form) return;
  const error = /** @type {HTMLElement} */ (document.getElementById("rollout-error"));
  const textarea = /** @type {HTMLTextAreaElement} */ (form.elements.namedItem("workload"));
  // The fields start as the deployment runs now; the JSON view stays for those who want it.
  /** @type {Object<string, unknown>} */
  let current = {};
  try {
    current = textarea.value ? JSON.parse(textarea.value) : {};
  } catch {
    current = {};
  }
  fillWorkload(form, current);
  // What the fields do not cover (the API's other workload keys) is kept as it is.
  const kept = Object.fromEntries(
    Object.entries(current || {}).filter(([key]) => !WORKLOAD_FIELDS.includes(key)),
  );
  form.addEventListener("change", () => syncWorkload(form));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    textarea.removeAttribute("aria-invalid");
    const json = /** @type {HTMLDetailsElement} */ (document.getElementById("rollout-json"));
    let workload;
    if (json.open) {
      try {
        workload = JSON.parse(textarea.value);
      } catch (e) {
        error.textContent = `The workload is not valid JSON: ${/** @type {Error} */ (e).message}`;
        error.hidden = false;
        textarea.setAttribute("aria-invalid", "true");
        return;
      }
    } else {
      workload = { ...kept, ...(workloadBody(new FormData(form)) || { runtime: "none" }) };
    }
    const data = new FormData(form);
    const rollout = {
      max_surge: Number(data.get("max_surge")),
      max_unavailable: Number(data.get("max_unavailable")),
    };
    const result = await api("PATCH", `/api/v1/deployments/${deploymentId}/`, {
      workload,
      rollout,
    });
    if (!result.ok) {
      const details = result.data?.details || {};
      const problems = (details.problems || []).map(
        (/** @type {{field: string, message: string}} */ p) => `${p.field}: ${p.message}`,
      );
      error.textContent = [
        result.data?.message || `The request failed (${result.status}).`,
        ...problems,
      ].join(" · ");
      error.hidden = false;
      textarea.setAttribute("aria-invalid", "true");
      return;
    }
    follow(result.data, `Rolling update of ${name}`);
  });
}

/** A GPU by its name (learnt before the plan is drawn). @param {number} id */
function named(id) {
  return gpuName(id) || "a GPU no longer in the fleet";
}

/** @param {any} plan */
function describePlan(plan) {
  if (plan.fits_now)
    return [el("p", { text: "The next replica fits now: use Place all or Place… above." })];
  if (!plan.target) return [el("p", { text: "No plan of a few moves lets the next replica fit." })];
  const items = plan.moves.map((/** @type {any} */ m) =>
    el("li", {
      text:
        m.allocation != null
          ? `Move a replica (allocation ${m.allocation}) from ${named(m.from_gpu)} to ${named(m.to_gpu)}`
          : `Destroy an idle slice on ${named(m.from_gpu)}`,
    }),
  );
  return [
    el("ol", {}, ...items),
    el("p", { class: "muted small", text: `Then the replica fits on ${named(plan.target.gpu)}.` }),
    el("button", { type: "button", class: "btn small primary", id: "defrag-apply" }, "Apply"),
  ];
}

function wireDefrag() {
  const show = document.getElementById("defrag-show");
  const box = document.getElementById("defrag-plan");
  if (!show || !box) return;
  show.addEventListener("click", async () => {
    const result = await api("GET", `/api/v1/deployments/${deploymentId}/defrag`);
    if (!result.ok) {
      toastError(result, "No proposal");
      return;
    }
    const plan = result.data;
    await learnGpuNames([
      ...(plan.moves || []).flatMap((/** @type {any} */ m) => [m.from_gpu, m.to_gpu]),
      plan.target?.gpu,
    ]);
    box.replaceChildren(...describePlan(plan));
    document.getElementById("defrag-apply")?.addEventListener("click", async () => {
      const applied = await api("POST", `/api/v1/deployments/${deploymentId}/defrag`, {});
      if (!applied.ok) {
        toastError(applied, "Could not apply the proposal");
        return;
      }
      box.replaceChildren(
        el("p", {
          text: `Applying: operation ${applied.data.id}. Each step shows in the operations.`,
        }),
      );
      follow(applied.data, `Making room for ${name}`);
    });
  });
}

function wireHandoff() {
  const form = /** @type {HTMLFormElement | null} */ (document.getElementById("handoff-form"));
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const select = /** @type {HTMLSelectElement} */ (form.elements.namedItem("team"));
    const team = select.selectedOptions[0]?.textContent || "";
    const sure = await confirmAction({
      title: `Hand ${name} to team ${team}?`,
      impact: `Its usage is billed to ${team} from now on, and ${team}'s members manage it.`,
      action: `Hand to ${team}`,
    });
    if (!sure) return;
    const result = await api("PATCH", `/api/v1/deployments/${deploymentId}/`, {
      team: Number(select.value),
    });
    if (!result.ok) {
      toastError(result, `Could not hand ${name} to ${team}`);
      return;
    }
    toast(`${name} now belongs to ${team}`, { kind: "ok", timeout: 5000 });
    window.location.reload(); // the team shows in the heading, the filters and who may act
  });
}

function wireDelete() {
  const button = /** @type {HTMLButtonElement | null} */ (document.getElementById("dep-delete"));
  if (!button) return;
  button.addEventListener("click", async () => {
    const replicas = document.querySelectorAll("#dep-replicas tr[data-replica]").length;
    const running = new Set(
      [...document.querySelectorAll("#dep-replicas tr[data-replica]")]
        .filter((row) => row.querySelector('[data-workload="running"]'))
        .map((row) => /** @type {HTMLElement} */ (row).dataset.replica),
    ).size;
    const sure = await confirmAction({
      title: `Delete ${name}?`,
      impact:
        (running
          ? `${running} running replica${running === 1 ? " stops" : "s stop"}`
          : `Its ${replicas} replica${replicas === 1 ? "" : "s"} go${replicas === 1 ? "es" : ""}`) +
        " and their slices are freed. The audit trail stays.",
      action: "Delete",
    });
    if (!sure) return;
    const result = await api("DELETE", `/api/v1/deployments/${deploymentId}/`);
    if (!result.ok) {
      toastError(result, `Could not delete ${name}`);
      return;
    }
    // Back to the list, where the row shows it going while its workloads stop.
    button.disabled = true;
    window.location.assign(`/deployments/?deleted=${encodeURIComponent(name)}`);
  });
}

wireRollout();
wireDefrag();
wireHandoff();
wireDelete();
