// @ts-check
// The capacity page: a product is chosen first (a GET form: the page reloads for it); the
// matrix, the strip and the products are re-rendered by the server after a change (debounced), and the
// "what would fit" form asks the REST API (GET /api/v1/capacity/?kind=…) and says its answer.
// When replicas wait, operators ask the layout advisor (GET /api/v1/capacity/advice?product=…,
// rate-limited: a 429 says when to ask again) for layouts and apply the proposal as a rollout
// (POST /api/v1/rollouts/, its exact body); other roles see no form.
import { confirmAction } from "./confirm.js";
import { api, debounce, refreshOnChanges, refreshParts, toast, toastError } from "./core.js";

const form = /** @type {HTMLFormElement} */ (document.getElementById("cap-form"));
const kind = /** @type {HTMLSelectElement} */ (document.getElementById("cap-kind"));
const answer = /** @type {HTMLElement} */ (document.getElementById("cap-answer"));

/** Shows the fields of the chosen kind; hidden fields are disabled, so they are not sent. */
function showFields() {
  for (const label of form.querySelectorAll("label[data-kind]")) {
    const mine = /** @type {HTMLElement} */ (label).dataset.kind === kind.value;
    /** @type {HTMLElement} */ (label).hidden = !mine;
    for (const input of label.querySelectorAll("input, select")) {
      /** @type {HTMLInputElement} */ (input).disabled = !mine;
    }
  }
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

/** The answer as one sentence (the API's `request`). */
function sentence(request) {
  const what =
    request.kind === "mig"
      ? `${request.profile} instance`
      : request.kind === "mps"
        ? `MPS share of ${request.memory_mib} MiB${request.max_compute_percent ? ` (≤ ${request.max_compute_percent}% compute)` : ""}`
        : `${plural(request.gpu_count, "whole GPU", "whole GPUs")} on one host`;
  let text = `${plural(request.fits_now, "replica", "replicas")} of a ${what} fit${request.fits_now === 1 ? "s" : ""} now`;
  if (request.fits_if_idle_reshaped !== null && request.fits_if_idle_reshaped !== undefined) {
    text += `; ${request.fits_if_idle_reshaped} after reshaping idle instances`;
  }
  return `${text}.`;
}

async function ask(event) {
  event.preventDefault();
  const query = new URLSearchParams();
  for (const [name, value] of new FormData(form)) {
    if (String(value).trim() !== "") query.set(name, String(value).trim());
  }
  answer.dataset.state = "asking";
  answer.textContent = "Asking…";
  const result = await api("GET", `/api/v1/capacity/?${query}`);
  if (!result.ok) {
    answer.dataset.state = "error";
    answer.textContent = `${result.data?.message || "The question could not be answered."} (${result.data?.code || result.status})`;
    return;
  }
  const request = result.data.request;
  answer.dataset.state = "ok";
  answer.replaceChildren(document.createTextNode(sentence(request)));
  if (request.products.length > 1) {
    const list = document.createElement("ul");
    for (const p of request.products) {
      const item = document.createElement("li");
      item.textContent =
        `${p.product}: ${p.fits_now} now` +
        (p.fits_if_idle_reshaped === null ? "" : `, ${p.fits_if_idle_reshaped} after reshaping`);
      list.append(item);
    }
    answer.append(list);
  }
}

// The chosen product (?product=) is the server's: the live parts are fetched for it too.
const refresh = debounce(
  () => refreshParts(`/ui/capacity${location.search}`, ["#cap-panel", "#cap-products"]),
  500,
);

const choose = /** @type {HTMLFormElement} */ (document.getElementById("cap-choose"));
choose.querySelector("select")?.addEventListener("change", () => choose.requestSubmit());

const adviceForm = /** @type {HTMLFormElement | null} */ (document.getElementById("advice-form"));
const adviceAnswer = /** @type {HTMLElement | null} */ (document.getElementById("advice-answer"));
const proposal = /** @type {HTMLElement | null} */ (document.getElementById("advice-proposal"));
const applyButton = /** @type {HTMLButtonElement | null} */ (
  document.getElementById("advice-apply")
);
/** @type {object | null} the rollout body of the proposal shown */
let proposedRollout = null;
/** @type {any} the advice the proposal shown comes from */
let proposedAdvice = null;

/** One line per GPU: its new layout, what it places and what moves. */
function proposalRow(gpu) {
  const row = document.createElement("tr");
  const cells = [
    gpu.name,
    gpu.instances.map((i) => `${i.profile}@${i.start}${i.mps ? " (MPS)" : ""}`).join(", ") ||
      "empty",
    gpu.places
      .filter((p) => p.serves !== "moved")
      .map((p) => `${p.serves} ×${p.replicas} on ${p.profile}@${p.start}`)
      .join("; ") || "—",
    gpu.drained
      ? `drain: ${plural(gpu.moved_replicas, "replica moves", "replicas move")}`
      : "none (reshaped in place)",
  ];
  for (const text of cells) {
    const cell = document.createElement("td");
    cell.textContent = String(text);
    row.append(cell);
  }
  return row;
}

async function propose(event) {
  event.preventDefault();
  if (!adviceForm || !adviceAnswer || !proposal) return;
  const product = String(new FormData(adviceForm).get("product") || "");
  adviceAnswer.dataset.state = "asking";
  adviceAnswer.textContent = "The solver is looking for layouts…";
  proposal.hidden = true;
  proposedRollout = null;
  const result = await api("GET", `/api/v1/capacity/advice?${new URLSearchParams({ product })}`);
  if (!result.ok) {
    adviceAnswer.dataset.state = "error";
    adviceAnswer.textContent = `${result.data?.message || "No advice."} (${result.data?.code || result.status})`;
    return;
  }
  const advice = result.data;
  const solver = advice.solver;
  adviceAnswer.dataset.state = "ok";
  adviceAnswer.textContent =
    `Places ${advice.placed_replicas} of ${plural(advice.waiting_replicas, "waiting replica", "waiting replicas")}, ` +
    `moves ${plural(advice.moved_replicas, "running replica", "running replicas")}, on ${plural(advice.gpus.length, "GPU", "GPUs")} ` +
    `(${solver.status}; gap to the bound ${solver.gap_percent} %; ${solver.time_s} s).`;
  if (!advice.rollout) return;
  proposedRollout = advice.rollout;
  proposedAdvice = advice;
  proposal.querySelector("tbody")?.replaceChildren(...advice.gpus.map(proposalRow));
  proposal.hidden = false;
}

async function applyProposal() {
  if (!proposedRollout || !applyButton) return;
  const count = proposedRollout.layouts.length;
  const gpus = proposedAdvice?.gpus || [];
  const moved = gpus.reduce((n, g) => n + (g.drained ? g.moved_replicas : 0), 0);
  const ok = await confirmAction({
    title: `Reshape ${plural(count, "GPU", "GPUs")}?`,
    impact:
      `${plural(count, "GPU is", "GPUs are")} reshaped as proposed, one at a time; ` +
      (moved
        ? `${plural(moved, "running replica moves", "running replicas move")} off first.`
        : "no running replica moves."),
    action: "Reshape",
    details: gpus.map(
      (g) =>
        `${g.name}: ${g.drained ? `drain, ${plural(g.moved_replicas, "replica moves", "replicas move")}` : "reshaped in place"}`,
    ),
  });
  if (!ok) return;
  applyButton.disabled = true;
  const result = await api("POST", "/api/v1/rollouts/", proposedRollout);
  applyButton.disabled = false;
  if (!result.ok) {
    toastError(result, "Could not start the rollout");
    return;
  }
  toast(`Rollout ${result.data.id} started`, { kind: "ok", lines: [result.data.summary || ""] });
  proposedRollout = null;
  if (proposal) proposal.hidden = true;
}

adviceForm?.addEventListener("submit", propose);
applyButton?.addEventListener("click", applyProposal);
kind.addEventListener("change", showFields);
form.addEventListener("submit", ask);
showFields();

// Capacity moves with placements, layouts, health, cordons and host status.
refreshOnChanges((c) => c.gpu || c.host || c.allocation || c.deployment || c.partition, refresh);
