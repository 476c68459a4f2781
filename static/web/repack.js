// @ts-check
// The capacity page's repack proposal: GET /api/v1/capacity/repack?product=…&free_gpus=N shows
// the moves that empty N GPUs of a product (cost, the solver's bound, the method), a link that
// outlines the GPUs involved on the fleet view (/?highlight=…), and, for operators, Apply
// (POST): one repack operation, followed here until it ends.
import { api, canOperate, el, followWithToasts } from "./core.js";

const form = /** @type {HTMLFormElement} */ (document.getElementById("repack-form"));
const box = /** @type {HTMLElement} */ (document.getElementById("repack-plan"));

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/** @param {any} move */
function moveText(move) {
  if (move.to_gpu === null) return `Destroy an idle slice on ${move.from_label}`;
  const who = move.deployment
    ? `${move.deployment}[${move.replica}]`
    : `allocation ${move.allocation}`;
  return `Move ${who} from ${move.from_label} to ${move.to_label}`;
}

/** The GPUs a plan touches: those it empties and those that receive. @param {any} plan */
function involved(plan) {
  const ids = new Set(plan.freed.map((/** @type {any} */ g) => g.gpu));
  for (const m of plan.moves) if (m.to_gpu !== null) ids.add(m.to_gpu);
  return [...ids];
}

/** @param {any} plan @param {FormData} asked */
function describe(plan, asked) {
  const method = plan.method === "cp-sat" ? "CP-SAT" : "greedy";
  if (!plan.feasible) {
    return [
      el("p", { class: "repack-summary", text: `No plan: ${plan.reason}` }),
      el("p", {
        class: "muted small",
        text: `${plural(plan.already_free, "GPU", "GPUs")} of ${plan.product} already free (${method}, ${plan.status}).`,
      }),
    ];
  }
  const parts = [
    el("p", {
      class: "repack-summary",
      text: `Empty ${plan.freed.map((/** @type {any} */ g) => `${g.host}/gpu${g.index}`).join(", ")} by moving ${plural(plan.cost, "replica", "replicas")}.`,
    }),
    el(
      "dl",
      { class: "repack-figures" },
      el("dt", { text: "Cost" }),
      el("dd", { class: "repack-cost", text: String(plan.cost) }),
      el("dt", { text: "Lower bound" }),
      el("dd", { class: "repack-bound", text: String(plan.bound) }),
      el("dt", { text: "Method" }),
      el("dd", { class: "repack-method", text: `${method} (${plan.status})` }),
    ),
  ];
  if (plan.reason) parts.push(el("p", { class: "muted small", text: plan.reason }));
  if (plan.moves.length)
    parts.push(
      el(
        "ol",
        { class: "repack-moves" },
        ...plan.moves.map((/** @type {any} */ m) => el("li", { text: moveText(m) })),
      ),
    );
  if (plan.unmovable.length) {
    parts.push(
      el("p", {
        class: "muted small",
        text: `Not emptied: ${plan.unmovable.map((/** @type {any} */ u) => `${u.host}/gpu${u.index} ${u.reason}`).join("; ")}.`,
      }),
    );
  }
  const actions = el(
    "p",
    { class: "repack-actions" },
    el(
      "a",
      { href: `/?highlight=${involved(plan).join(",")}`, id: "repack-highlight" },
      "Show these GPUs on the fleet view",
    ),
  );
  if (canOperate) {
    actions.append(
      " ",
      el(
        "button",
        {
          type: "button",
          class: "btn small primary",
          id: "repack-apply",
          onclick: () => apply(asked),
        },
        "Apply",
      ),
    );
  }
  parts.push(actions);
  return parts;
}

/** @param {FormData} asked */
async function apply(asked) {
  const body = {
    product: String(asked.get("product")),
    free_gpus: Number(asked.get("free_gpus")),
    max_unavailable: Number(asked.get("max_unavailable") || 1),
  };
  const button = /** @type {HTMLButtonElement | null} */ (document.getElementById("repack-apply"));
  if (button) button.disabled = true;
  const result = await api("POST", "/api/v1/capacity/repack", body);
  if (!result.ok) {
    box.dataset.state = "error";
    box.replaceChildren(
      el("p", {
        text: `${result.data?.message || "The repack could not start."} (${result.data?.code || result.status})`,
      }),
    );
    return;
  }
  const progress = el("p", {
    id: "repack-progress",
    text: `Applying: operation ${result.data.id}.`,
  });
  box.dataset.state = "applying";
  box.replaceChildren(progress);
  followWithToasts(result.data, {
    succeeded: "Repack succeeded",
    failed: "Repack",
    onProgress: (latest) => {
      const log = latest.payload?.log || [];
      progress.textContent = `Applying (operation ${latest.id}): ${log.length ? log[log.length - 1].note : ""}`;
    },
    onEnd: (latest) => {
      box.dataset.state = latest.status === "succeeded" ? "done" : "error";
      progress.textContent = `Repack ${latest.status}: ${latest.reason}`;
    },
  });
}

async function propose(/** @type {SubmitEvent} */ event) {
  event.preventDefault();
  const asked = new FormData(form);
  const query = new URLSearchParams({
    product: String(asked.get("product") || ""),
    free_gpus: String(asked.get("free_gpus") || "").trim(),
  });
  box.dataset.state = "asking";
  box.textContent = "Planning…";
  const result = await api("GET", `/api/v1/capacity/repack?${query}`);
  if (!result.ok) {
    box.dataset.state = "error";
    box.textContent = `${result.data?.message || "No proposal."} (${result.data?.code || result.status})`;
    return;
  }
  box.dataset.state = result.data.feasible ? "ok" : "none";
  box.replaceChildren(...describe(result.data, asked));
}

form.addEventListener("submit", propose);
