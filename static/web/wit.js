// @ts-check
// "What would it take?": the ranked plans that would place a waiting replica
// (GET /api/v1/allocations/{id}/what-would-it-take), shown in a panel on the deployment page and
// in a dialog from the fleet's tray. Apply sends the plan's exact requests, in order, waiting
// between them where the plan says so; a destructive plan asks first (confirm.js).
import { api, el, isFinal, toast, toastError } from "./core.js";
import { confirmAction } from "./confirm.js";

const API = "/api/v1";
const WAIT_MS = 500;
const WAIT_LIMIT_MS = 120000;

/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * @typedef {{method: string, path: string, body: any, after: string}} PlanRequest
 * @typedef {{rank: number, kind: string, summary: string, requests: PlanRequest[], moved: number,
 *   stopped: number, reshaped: number, destructive: boolean, role: string, may_apply: boolean,
 *   proof: {claim?: string}, details: {when?: string, at?: string | null}}} Plan
 */

const KIND_LABEL = {
  place: "Place now",
  moves: "Move",
  reshape: "Reshape",
  quota: "Quota change",
  stop: "Stop borrowed work",
  wait: "Wait",
};
const ROLE_LABEL = {
  team_operator: "its team's operators",
  operator: "operators",
  admin: "admins",
};

/** @param {PlanRequest} r */
function requestLine(r) {
  return `${r.method} ${API}${r.path}${r.body ? " " + JSON.stringify(r.body) : ""}`;
}

/**
 * What the plan costs, in words.
 * @param {Plan} plan
 */
function costWords(plan) {
  const parts = [];
  if (plan.stopped) parts.push(`${plan.stopped} stopped`);
  if (plan.moved) parts.push(`${plan.moved} moved`);
  if (plan.reshaped) parts.push(`${plan.reshaped} GPU${plan.reshaped === 1 ? "" : "s"} reshaped`);
  if (plan.kind === "wait") parts.push(plan.details.at ? `at ${plan.details.at}` : "time unknown");
  return parts.join(" · ");
}

/**
 * Renders the answer into `box`.
 * @param {HTMLElement} box
 * @param {any} data the API's answer
 * @param {string} ref
 */
function render(box, data, ref) {
  const blocked = {
    none: "It fits now.",
    capacity: "No GPU has room for it now.",
    quota: "Its team's quota blocks it.",
  }[data.blocked_by];
  const list = el("ol", { class: "wit-plans" });
  /** @type {{operation: number, kind: string, requested_by: string | null} | null} */
  const busy = data.in_progress || null;
  for (const plan of /** @type {Plan[]} */ (data.plans)) {
    const button =
      plan.requests.length && plan.may_apply && !busy
        ? el(
            "button",
            {
              type: "button",
              class: plan.destructive ? "btn small danger" : "btn small",
              "data-wit-apply": String(plan.rank),
              "aria-label": `Apply plan ${plan.rank}: ${plan.summary}`,
            },
            "Apply",
          )
        : null;
    const who =
      plan.requests.length && !plan.may_apply && !busy
        ? el("span", {
            class: "muted small",
            text: `Only ${ROLE_LABEL[plan.role] || plan.role} may apply it.`,
          })
        : null;
    list.append(
      el(
        "li",
        { class: `wit-plan wit-${plan.kind}`, "data-kind": plan.kind },
        el(
          "div",
          { class: "wit-head" },
          el("strong", { text: KIND_LABEL[plan.kind] || plan.kind }),
          el("span", { class: "muted small", text: costWords(plan) }),
        ),
        el("p", { class: "wit-summary", text: plan.summary }),
        plan.proof && plan.proof.claim
          ? el("p", { class: "muted small wit-proof", text: plan.proof.claim })
          : null,
        plan.requests.length
          ? el(
              "ul",
              { class: "wit-requests small" },
              ...plan.requests.map((r) => el("li", {}, el("code", { text: requestLine(r) }))),
            )
          : null,
        el("div", { class: "wit-actions" }, button, who),
      ),
    );
  }
  const placing = busy
    ? el("p", {
        class: "wit-in-progress",
        "data-operation": String(busy.operation),
        text:
          `${busy.requested_by ? busy.requested_by + "'s" : "Fleet's"} ${busy.kind} ` +
          `(operation ${busy.operation}) is placing it now: no plan needs applying.`,
      })
    : null;
  box.replaceChildren(
    el(
      "p",
      { class: "wit-blocked" },
      `Replica ${data.deployment_name}[${data.replica}]: ${blocked} `,
      el("span", {
        class: "muted small",
        text: data.cached ? "Answered from the background refresh." : "Computed just now.",
      }),
    ),
    ...(placing ? [placing] : []),
    list,
  );
  box.dataset.witRef = ref;
  box.dataset.witState = "ready";
  box.onclick = async (e) => {
    const target = /** @type {HTMLElement} */ (e.target).closest("[data-wit-apply]");
    if (!target) return;
    const plan = data.plans.find(
      (/** @type {Plan} */ p) => String(p.rank) === target.getAttribute("data-wit-apply"),
    );
    if (plan) await applyPlan(box, plan, ref, /** @type {HTMLButtonElement} */ (target));
  };
}

/**
 * Loads the answer for `ref` into `box`. Resolves to false when nothing waits (409).
 * @param {HTMLElement} box
 * @param {string} ref DEPLOYMENT.REPLICA or DEPLOYMENT.next
 */
export async function loadWit(box, ref) {
  box.dataset.witState = "loading";
  box.setAttribute("aria-busy", "true");
  const result = await api("GET", `${API}/allocations/${ref}/what-would-it-take`);
  box.removeAttribute("aria-busy");
  if (result.status === 409) {
    box.replaceChildren(
      el("p", { class: "muted small", text: "Every replica is placed: nothing to do." }),
    );
    box.dataset.witState = "placed";
    return false;
  }
  if (!result.ok) {
    box.replaceChildren(
      el("p", { class: "form-error", role: "alert", text: result.data?.message || "Failed." }),
    );
    box.dataset.witState = "error";
    return true;
  }
  render(box, result.data, ref);
  return true;
}

/**
 * The operations a response started (one, or a list), by id and status.
 * @param {any} data
 * @returns {{id: number, status: string}[]}
 */
function operationsOf(data) {
  const list = Array.isArray(data) ? data : data && data.placed ? data.placed : [data];
  return list.filter((o) => o && typeof o.id === "number" && typeof o.status === "string");
}

/** @param {{id: number, status: string}[]} operations */
async function untilDone(operations) {
  const end = Date.now() + WAIT_LIMIT_MS;
  for (const op of operations) {
    let status = op.status;
    while (!isFinal(status) && Date.now() < end) {
      await sleep(WAIT_MS);
      const seen = await api("GET", `${API}/operations/${op.id}/`);
      if (seen.ok) status = seen.data.status;
    }
    if (status !== "succeeded") return false;
  }
  return true;
}

/**
 * Sends `request`; with `after: "released"`, again while it is refused (the stopped replicas'
 * slices are not back yet), until it is taken or the wait runs out.
 * @param {PlanRequest} request
 */
async function send(request) {
  const url = API + request.path;
  const body = request.body === null ? undefined : request.body;
  let result = await api(request.method, url, body);
  const end = Date.now() + WAIT_LIMIT_MS;
  while (request.after === "released" && !result.ok && result.status >= 409 && Date.now() < end) {
    await sleep(WAIT_MS);
    result = await api(request.method, url, body);
  }
  return result;
}

/**
 * Applies the plan: its requests in order, each after what it waits for.
 * @param {HTMLElement} box
 * @param {Plan} plan
 * @param {string} ref
 * @param {HTMLButtonElement} button
 */
async function applyPlan(box, plan, ref, button) {
  if (plan.destructive) {
    const ok = await confirmAction({
      title: `Apply: ${KIND_LABEL[plan.kind] || plan.kind}`,
      impact: plan.summary,
      action: "Apply",
      details: plan.requests.map(requestLine),
    });
    if (!ok) return;
  }
  button.disabled = true;
  box.dataset.witState = "applying";
  /** @type {any} */
  let previous = null;
  for (const request of plan.requests) {
    if (request.after === "operation" && previous && !(await untilDone(operationsOf(previous)))) {
      toast("The plan stopped", { kind: "error", lines: ["An operation it waited for failed."] });
      break;
    }
    const result = await send(request);
    if (!result.ok) {
      toastError(result, `${request.method} ${request.path} failed`);
      box.dataset.witState = "failed";
      button.disabled = false;
      return;
    }
    previous = result.data;
  }
  toast("Plan applied", { kind: "ok", lines: [plan.summary] });
  box.dataset.witState = "applied";
  await loadWit(box, ref);
}

/**
 * Opens a dialog with the plans for `ref` (the fleet's tray).
 * @param {string} ref
 * @param {string} name the deployment's name
 */
export function openWitDialog(ref, name) {
  const box = el("div", { class: "wit-box", id: "wit-dialog-box" });
  const close = el("button", { type: "button", class: "btn", "data-close": "1" }, "Close");
  const dialog = /** @type {HTMLDialogElement} */ (
    el(
      "dialog",
      { class: "dialog wit-dialog", "aria-labelledby": "wit-dialog-title", id: "wit-dialog" },
      el("header", {}, el("h2", { id: "wit-dialog-title", text: `What would it take? ${name}` })),
      box,
      el("footer", {}, close),
    )
  );
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  loadWit(box, ref);
  return dialog;
}
