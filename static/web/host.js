// @ts-check
// One host: its head, maintenance, GPUs, labels and operations re-rendered by the server after
// a change; cordon, uncordon, drain (now or at a time) and labels (operators) and the
// reservation (admins) through the REST API, the API's message shown when it refuses.
import { api, debounce, refreshOnChanges, refreshParts, toast } from "./core.js";
import { confirmAction } from "./confirm.js";

const page = /** @type {HTMLElement} */ (document.getElementById("host-page"));
const hostId = Number(page.dataset.host);
const gpuIds = (page.dataset.gpus || "").split(",").filter(Boolean).map(Number);
const PARTS = ["#host-head", "#host-maint", "#host-gpus", "#host-labels", "#host-side"];
const error = /** @type {HTMLElement | null} */ (document.getElementById("maint-error"));

const refresh = debounce(() => refreshParts(`/ui/hosts/${hostId}/panel`, PARTS), 250);

refreshOnChanges(
  (c) =>
    (c.host || []).includes(hostId) ||
    (c.gpu || []).some((id) => gpuIds.includes(id)) ||
    c.operation,
  refresh,
);

/** Show the API's message (or clear it). */
function showError(result) {
  if (!error) return;
  if (result === null) {
    error.hidden = true;
    error.textContent = "";
    return;
  }
  error.textContent =
    (result.data && result.data.message) || `The request failed (${result.status}).`;
  error.hidden = false;
}

/**
 * The drain's impact, from the GPU table: how many replicas move (or stop, with force).
 * @param {boolean} force @param {string} [when]
 */
function confirmDrain(force, when) {
  const replicas = [...document.querySelectorAll("#host-gpu-table tr[data-replicas]")]
    .map((row) => Number(/** @type {HTMLElement} */ (row).dataset.replicas) || 0)
    .reduce((a, b) => a + b, 0);
  const what = replicas
    ? `${replicas} replica${replicas === 1 ? " moves" : "s move"} to other hosts` +
      (force ? "; any that fit nowhere stop" : "; any that fit nowhere keep the drain waiting")
    : "No replica runs here: the host is emptied and cordoned";
  return confirmAction({
    title: when ? `Drain this host at ${when}?` : "Drain this host?",
    impact: `${what}. New replicas are not placed here until it is uncordoned.`,
    action: when ? "Schedule drain" : "Drain",
  });
}

async function act(action, body) {
  showError(null);
  const result = await api("POST", `/api/v1/hosts/${hostId}/${action}`, body);
  if (!result.ok) {
    showError(result);
    return;
  }
  const done =
    { cordon: "cordoned", uncordon: "back in service", drain: "drain started" }[action] || action;
  toast(`Host ${done}`, { kind: "ok" });
  refresh();
}

const actions = document.getElementById("maint-actions");
if (actions) {
  const force = /** @type {HTMLInputElement} */ (document.getElementById("drain-force"));
  actions.addEventListener("click", (event) => {
    const button = /** @type {HTMLElement} */ (event.target).closest("button[data-action]");
    if (!button) return;
    const action = /** @type {HTMLElement} */ (button).dataset.action || "";
    if (action === "drain") {
      confirmDrain(force.checked).then((sure) => sure && act(action, { force: force.checked }));
      return;
    }
    act(action, undefined);
  });
}

const scheduleForm = /** @type {HTMLFormElement | null} */ (
  document.getElementById("drain-at-form")
);
if (scheduleForm) {
  const input = /** @type {HTMLInputElement} */ (scheduleForm.elements.namedItem("at"));
  scheduleForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const when = new Date(input.value);
    if (!input.value || Number.isNaN(when.getTime())) {
      showError({ status: 400, data: { message: "Choose the date and time the drain starts." } });
      input.setAttribute("aria-invalid", "true");
      return;
    }
    input.removeAttribute("aria-invalid");
    const force = /** @type {HTMLInputElement | null} */ (document.getElementById("drain-force"));
    const forced = Boolean(force && force.checked);
    confirmDrain(forced, when.toLocaleString()).then(
      (sure) => sure && act("drain", { at: when.toISOString(), force: forced }),
    );
  });
}

const labelsForm = /** @type {HTMLFormElement | null} */ (document.getElementById("labels-form"));
if (labelsForm) {
  const input = /** @type {HTMLTextAreaElement} */ (labelsForm.elements.namedItem("labels"));
  const labelsError = /** @type {HTMLElement} */ (document.getElementById("labels-error"));
  labelsForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    /** @type {Object<string, string>} */
    const labels = {};
    for (const line of input.value.split("\n")) {
      if (!line.trim()) continue;
      const at = line.indexOf("=");
      // The server judges keys and values (and says why it refuses): send what was typed.
      if (at < 0) labels[line.trim()] = "";
      else labels[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    labelsError.hidden = true;
    input.removeAttribute("aria-invalid");
    const result = await api("PATCH", `/api/v1/hosts/${hostId}/`, { labels });
    if (!result.ok) {
      const problems = (result.data && result.data.details && result.data.details.fields) || null;
      const detail = problems && problems.labels ? ` ${[].concat(problems.labels).join(" ")}` : "";
      labelsError.textContent =
        ((result.data && result.data.message) || `The request failed (${result.status}).`) + detail;
      labelsError.hidden = false;
      input.setAttribute("aria-invalid", "true");
      return;
    }
    toast("Labels saved", { kind: "ok" });
    refresh();
  });
}

const reserveForm = /** @type {HTMLFormElement | null} */ (document.getElementById("reserve-form"));
if (reserveForm) {
  const input = /** @type {HTMLInputElement} */ (reserveForm.elements.namedItem("teams"));
  const reserveError = /** @type {HTMLElement} */ (document.getElementById("reserve-error"));
  reserveForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    // The server judges the teams (and says which it does not know): send what was typed.
    const teams = input.value
      .split(",")
      .map((team) => team.trim())
      .filter(Boolean);
    reserveError.hidden = true;
    input.removeAttribute("aria-invalid");
    const result = await api("PUT", `/api/v1/hosts/${hostId}/reservation`, { teams });
    if (!result.ok) {
      reserveError.textContent =
        (result.data && result.data.message) || `The request failed (${result.status}).`;
      reserveError.hidden = false;
      input.setAttribute("aria-invalid", "true");
      return;
    }
    toast(teams.length ? "Reservation saved" : "Reservation lifted", { kind: "ok" });
    refresh();
  });
}
