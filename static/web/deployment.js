// @ts-check
// One deployment: its head, replicas, events and operations re-rendered by the server after a
// change, and the replica count (operators) changed through the REST API.
import { api, debounce, refreshOnChanges, refreshParts, toast } from "./core.js";
import { confirmAction } from "./confirm.js";
import { wireLogs } from "./logs.js";
import { placeAll, wirePlacing } from "./placing.js";
import { loadWit } from "./wit.js";

const page = /** @type {HTMLElement} */ (document.getElementById("deployment-page"));
const deploymentId = Number(page.dataset.deployment);
const PARTS = ["#dep-head", "#dep-replicas", "#dep-side"];
// Place all and Place… in the head (replicas that fit now), Move… on each placed replica.
wirePlacing(page);
// The replica log viewer (logs.js): its replica picker follows the re-rendered table.
const { sync: syncLogReplicas } = wireLogs();
let gone = false;

/** The GPUs its replicas hold (an agent's ack or event names the GPU, not the deployment). */
function gpuIds() {
  const raw = document.getElementById("replicas")?.dataset.gpus || "";
  return raw.split(",").filter(Boolean).map(Number);
}

function showGone() {
  const head = document.getElementById("dep-head");
  if (head && !document.getElementById("dep-gone")) {
    const note = document.createElement("p");
    note.id = "dep-gone";
    note.className = "form-error";
    note.setAttribute("role", "status");
    note.textContent = "This deployment has been deleted.";
    head.append(note);
  }
  for (const control of document.querySelectorAll("#scale-form input, #scale-form button")) {
    /** @type {HTMLInputElement} */ (control).disabled = true;
  }
}

const refresh = debounce(async () => {
  if (gone) return;
  const { ok, status } = await refreshParts(`/ui/deployments/${deploymentId}/panel`, PARTS);
  if (status === 404) {
    gone = true;
    showGone();
    return;
  }
  if (ok) {
    syncLogReplicas();
    showWit();
  }
}, 250);

/**
 * "What would it take?" for the first replica the table shows without a place; the panel hides
 * (and asks nothing) when every replica is placed.
 */
const witBox = document.getElementById("wit-box");
async function showWit() {
  const panel = document.getElementById("wit-panel");
  if (!witBox || !panel || witBox.dataset.witState === "applying") return;
  const row = /** @type {HTMLElement | null} */ (
    document.querySelector('#replicas tr[data-allocation-state="unplaced"]')
  );
  if (!row) {
    panel.hidden = true;
    witBox.dataset.witState = "placed";
    return;
  }
  panel.hidden = false;
  const waiting = await loadWit(witBox, `${deploymentId}.${row.dataset.replica}`);
  panel.hidden = !waiting;
}
showWit();

// The gateways measure an endpoint's traffic every second, with no change event: while the page
// is visible, its numbers are re-read every 5 s.
if (document.getElementById("dep-endpoint")) {
  setInterval(() => {
    if (!document.hidden) refresh();
  }, 5000);
}

refreshOnChanges((c) => {
  const mine = gpuIds();
  return (
    (c.deployment || []).includes(deploymentId) || (c.gpu || []).some((id) => mine.includes(id))
  );
}, refresh);

// ---- scaling (operators) ----------------------------------------------------------------------

/**
 * Scaling down stops the newest replicas: say how many, and how many of them run, first.
 * @param {number} wanted
 * @returns {Promise<boolean>}
 */
async function confirmScaleDown(wanted) {
  const leaving = [...document.querySelectorAll("#dep-replicas tr[data-replica]")].filter(
    (row) =>
      Number(/** @type {HTMLElement} */ (row).dataset.replica) >= wanted &&
      /** @type {HTMLElement} */ (row).dataset.allocationState !== "unplaced",
  );
  const replicas = new Set(leaving.map((row) => /** @type {HTMLElement} */ (row).dataset.replica));
  if (replicas.size === 0) return true;
  const running = new Set(
    leaving
      .filter((row) => row.querySelector('[data-workload="running"]'))
      .map((row) => /** @type {HTMLElement} */ (row).dataset.replica),
  );
  const stop = running.size
    ? `${plural(running.size, "running replica stops", "running replicas stop")}`
    : `${plural(replicas.size, "placed replica stops", "placed replicas stop")}`;
  const also =
    running.size && replicas.size > running.size
      ? ` (and ${plural(replicas.size - running.size, "placed one", "placed ones")} not running yet)`
      : "";
  return confirmAction({
    title: `Scale ${page.dataset.name || "this deployment"} down to ${wanted}?`,
    impact: `${stop}${also}. ${replicas.size === 1 ? "Its slice is" : "Their slices are"} freed once ${replicas.size === 1 ? "its workload has" : "their workloads have"} stopped.`,
    action: `Scale to ${wanted}`,
  });
}

/** "1 thing" or "3 things". @param {number} n @param {string} one @param {string} many */
function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

const form = /** @type {HTMLFormElement | null} */ (document.getElementById("scale-form"));
if (form) {
  const input = /** @type {HTMLInputElement} */ (form.elements.namedItem("replicas"));
  const button = /** @type {HTMLButtonElement} */ (form.querySelector("button[type=submit]"));
  const error = /** @type {HTMLElement} */ (document.getElementById("scale-error"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const raw = input.value.trim();
    // The server judges the value (and says why it refuses): send what was typed.
    const replicas = /^-?\d+$/.test(raw) ? Number(raw) : raw;
    if (typeof replicas === "number" && replicas >= 1 && !(await confirmScaleDown(replicas)))
      return;
    button.disabled = true;
    error.hidden = true;
    input.removeAttribute("aria-invalid");
    const result = await api("PATCH", `/api/v1/deployments/${deploymentId}/`, { replicas });
    button.disabled = false;
    if (!result.ok) {
      error.textContent =
        (result.data && result.data.message) || `The request failed (${result.status}).`;
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      return;
    }
    toast(`${result.data.name}: ${result.data.replicas} replicas wanted`, { kind: "ok" });
    // "Place new replicas automatically": those that fit now are placed at once.
    const auto = /** @type {HTMLInputElement | null} */ (document.getElementById("scale-place"));
    if (auto?.checked && result.data.status === "unplaced")
      await placeAll(deploymentId, result.data.name, button);
    refresh();
  });
}

// The endpoint's Copy button (the side panel is re-rendered: one listener on the page).
page.addEventListener("click", async (event) => {
  const button = /** @type {HTMLElement} */ (event.target).closest("[data-copy]");
  if (!(button instanceof HTMLElement)) return;
  const text = document.getElementById(button.dataset.copy || "")?.textContent || "";
  try {
    await navigator.clipboard.writeText(text);
    toast("Endpoint URL copied.", { kind: "ok" });
  } catch {
    // No clipboard (a page served over plain HTTP off localhost): select it for Ctrl+C.
    const range = document.createRange();
    range.selectNodeContents(
      /** @type {Node} */ (document.getElementById(button.dataset.copy || "")),
    );
    getSelection()?.removeAllRanges();
    getSelection()?.addRange(range);
    toast("The URL is selected: press Ctrl+C to copy it.");
  }
});

// ---- autoscaling (operators) ------------------------------------------------------------------

const autoscaling = /** @type {HTMLFormElement | null} */ (
  document.getElementById("autoscaling-form")
);
if (autoscaling) {
  const error = /** @type {HTMLElement} */ (document.getElementById("autoscaling-error"));
  /** @param {string} name */
  const field = (name) =>
    /** @type {HTMLInputElement} */ (autoscaling.elements.namedItem(name)).value.trim();
  /** @param {string} raw */
  const number = (raw) => (/^-?\d+(\.\d+)?$/.test(raw) ? Number(raw) : raw);
  /** @param {any} policy */
  const send = async (policy) => {
    error.hidden = true;
    const result = await api("PATCH", `/api/v1/deployments/${deploymentId}/`, {
      autoscaling: policy,
    });
    if (!result.ok) {
      error.textContent =
        (result.data && result.data.message) || `The request failed (${result.status}).`;
      error.hidden = false;
      return;
    }
    toast(policy ? `${result.data.name}: autoscaling on` : `${result.data.name}: autoscaling off`, {
      kind: "ok",
    });
    window.location.reload();
  };
  const replicaMetric = /** @type {HTMLElement} */ (document.getElementById("as-replica-metric"));
  const metricSelect = /** @type {HTMLSelectElement} */ (autoscaling.elements.namedItem("metric"));
  metricSelect.addEventListener("change", () => {
    replicaMetric.hidden = metricSelect.value !== "replica_metric";
  });
  /** The policy's target as the API takes it: a replica metric is a spec, the others a number. */
  const target = () =>
    field("metric") === "replica_metric"
      ? {
          replica_metric: {
            name: field("rm_name"),
            value: number(field("target")),
            port: field("rm_port"),
            path: field("rm_path"),
            aggregate: field("rm_aggregate"),
          },
        }
      : { [field("metric")]: number(field("target")) };
  autoscaling.addEventListener("submit", (event) => {
    event.preventDefault();
    // The server judges the values (and names the field it refuses): send what was typed.
    send({
      min: number(field("min")),
      max: number(field("max")),
      target: target(),
      scale_out_cooldown_s: number(field("scale_out_cooldown_s")),
      scale_in_cooldown_s: number(field("scale_in_cooldown_s")),
    });
  });
  document.getElementById("autoscaling-off")?.addEventListener("click", () => send(null));
}
