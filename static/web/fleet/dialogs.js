// @ts-check
// The keyboard and click alternatives to dragging: the Place dialog (every target with its
// verdict; for a placed replica, where to move it), Place all, evicting from the tray, and the
// new-deployment dialog.
import { api, canDeploy, el, toast, toastError, violations } from "../core.js";
import { changes } from "./changes.js";
import { move } from "./move.js";
import { place } from "./place.js";
import { showPolicy } from "./policy.js";
import { hostsBox, trayBox } from "./state.js";
import { confirmAction } from "../confirm.js";
import { openWitDialog } from "../wit.js";
import { splitArgs, syncWorkload, workloadBody } from "../workload_form.js";

export { splitArgs };
import { reasonText } from "../names.js";
import { describeTarget, fitNote, loadTargets, refusalList } from "./targets.js";

const placeDialog = /** @type {HTMLDialogElement} */ (document.getElementById("place-dialog"));

/** @param {HTMLElement} dep a tray deployment, or a placed replica (`data-allocation`): move it */
async function openPlaceDialog(dep) {
  const id = Number(dep.dataset.deployment);
  const name = dep.dataset.name || "";
  const allocation = dep.dataset.allocation ? Number(dep.dataset.allocation) : null;
  const from = /** @type {HTMLElement | null} */ (dep.closest("article.gpu"));
  /** @type {HTMLElement} */ (placeDialog.querySelector("#place-title")).textContent =
    `${allocation == null ? "Place" : "Move"} ${name}`;
  const list = /** @type {HTMLElement} */ (placeDialog.querySelector("#place-targets"));
  const sub = /** @type {HTMLElement} */ (placeDialog.querySelector("#place-sub"));
  list.replaceChildren(
    el("p", { class: "muted small" }, el("span", { class: "spinner" }), " Checking every GPU…"),
  );
  sub.textContent = dep.querySelector(".chip")?.textContent || "";
  placeDialog.showModal();
  const targets = await loadTargets(id);
  /** @param {{gpu?: number, partition?: number}} target @param {number} [gpu] its GPU */
  const choose = async (target, gpu) => {
    placeDialog.close();
    if (allocation == null) await place(id, name, target, null, gpu);
    else await move(allocation, name, from, target, gpu);
    dep.focus();
  };
  const verb = allocation == null ? "Place here" : "Move here";
  const rows = targets ? targetRows(targets, choose, verb) : fallbackRows(choose, verb);
  list.replaceChildren(...rows);
  list.querySelector("button")?.focus();
}

/**
 * @param {Map<number, import("./state.js").TargetInfo>} targets
 * @param {(target: {gpu?: number, partition?: number}, gpu?: number) => void} choose
 * @param {string} verb
 */
function targetRows(targets, choose, verb) {
  const feasible = [];
  for (const [gpu, info] of targets) {
    const card = document.getElementById(`gpu-${gpu}`);
    if (info.fit) feasible.push({ gpu, info, card });
  }
  feasible.sort((a, b) => (b.info.best?.score ?? 0) - (a.info.best?.score ?? 0));
  const rows = [el("h3", { text: `Fits (${feasible.length})` })];
  if (!feasible.length)
    rows.push(el("p", { class: "muted small", text: "No GPU can take it right now." }));
  for (const [rank, { gpu, info, card }] of feasible.slice(0, 50).entries()) {
    const target = info.gpuFeasible ? { gpu } : { partition: info.best.partition };
    rows.push(
      el(
        "div",
        { class: "target" },
        el(
          "div",
          {},
          el("div", { class: "where", text: describeTarget(card, target, gpu) }),
          el("div", { class: "score" }, fitNote(info), rank === 0 ? bestNote() : null),
        ),
        el(
          "button",
          {
            type: "button",
            class: "btn small primary",
            onclick: () => choose(target, gpu),
            "data-gpu": gpu,
          },
          verb,
        ),
      ),
    );
  }
  rows.push(...refusalList(targets));
  return rows;
}

/** The engine's first choice: what its ranking means, instead of a bare score. */
function bestNote() {
  return el(
    "span",
    {
      class: "best-fit",
      title:
        "The engine ranks the GPUs that fit: it packs replicas together and keeps room for the " +
        "larger requests likely to come. The first is its choice.",
    },
    " · best fit",
  );
}

/** Without a preview: the shown GPUs, and the server checks the fit.
 * @param {(target: {gpu: number}) => void} choose @param {string} verb */
function fallbackRows(choose, verb) {
  const rows = [
    el("p", {
      class: "muted small",
      text: "No fit preview from the server: pick a GPU and the server checks the fit.",
    }),
  ];
  for (const card of /** @type {HTMLElement[]} */ ([
    ...hostsBox.querySelectorAll("article.gpu:not([hidden])"),
  ]).slice(0, 200)) {
    const gpu = Number(card.dataset.gpu);
    rows.push(
      el(
        "div",
        { class: "target" },
        el("div", { class: "where", text: `${card.dataset.label} · ${card.dataset.mode}` }),
        el("button", { type: "button", class: "btn small", onclick: () => choose({ gpu }) }, verb),
      ),
    );
  }
  return rows;
}

/** "3 running replicas stop" (or how many placed ones are released). @param {HTMLElement} dep */
function evictImpact(dep) {
  const running = Number(
    /** @type {HTMLElement | null} */ (dep.querySelector("[data-running]"))?.dataset.running || 0,
  );
  const placed = Number(dep.dataset.placed || 0);
  const what = running
    ? `${running} running replica${running === 1 ? " stops" : "s stop"}`
    : `${placed} placed replica${placed === 1 ? " is" : "s are"} released`;
  return `${what}; ${dep.dataset.name} waits in the tray to be placed again.`;
}

/** @param {HTMLElement} dep */
async function evict(dep) {
  const name = dep.dataset.name;
  const sure = await confirmAction({
    title: `Evict ${name}?`,
    impact: evictImpact(dep),
    action: "Evict",
  });
  if (!sure) return;
  const result = await api("POST", `/api/v1/deployments/${dep.dataset.deployment}/evict`, {});
  if (!result.ok) {
    toastError(result, `Could not evict ${name}`);
    return;
  }
  toast(`Evicting ${name}`, {
    lines: [`${result.data.length} replica(s) released; the agents stop them.`],
  });
  changes.tray = true;
  changes.flush();
}

/** Places every replica of the deployment that fits now; the tray and the cards follow through
 * the live updates (and once here, for a browser whose socket is down).
 * @param {HTMLElement} dep @param {HTMLButtonElement} button */
async function placeAll(dep, button) {
  const name = dep.dataset.name;
  button.disabled = true;
  const result = await api("POST", `/api/v1/deployments/${dep.dataset.deployment}/place-all`, {});
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
  changes.tray = true;
  changes.add("gpu", [
    ...new Set(placed.map((/** @type {{gpu: number | null}} */ op) => op.gpu).filter(Boolean)),
  ]);
}

// ---- new deployment ---------------------------------------------------------------------------

const newDialog = /** @type {HTMLDialogElement} */ (document.getElementById("new-dialog"));
const newForm = /** @type {HTMLFormElement} */ (document.getElementById("new-form"));
const newError = /** @type {HTMLElement} */ (newForm.querySelector("#new-error"));
const newPolicy = /** @type {HTMLElement} */ (newForm.querySelector("#new-policy"));
const teamSelect = /** @type {HTMLSelectElement} */ (newForm.querySelector('select[name="team"]'));
const runtimeSelect = /** @type {HTMLSelectElement} */ (
  newForm.querySelector('select[name="runtime"]')
);

function syncPolicy() {
  showPolicy(teamSelect, newPolicy, runtimeSelect);
}

function syncKind() {
  const data = new FormData(newForm);
  const kind = data.get("kind");
  for (const label of /** @type {NodeListOf<HTMLElement>} */ (
    newForm.querySelectorAll("[data-for]")
  ))
    label.hidden = label.dataset.for !== kind;
  syncWorkload(newForm);
}

/** "field.sub: message" for every error in a nested DRF error object.
 * @param {unknown} node @param {string} [path] @returns {string[]} */
function fieldErrors(node, path = "") {
  if (node === null || node === undefined) return [];
  if (typeof node !== "object") return [`${path}: ${node}`];
  if (Array.isArray(node))
    return node.every((v) => typeof v !== "object")
      ? [`${path}: ${node.join(" ")}`]
      : node.flatMap((v, i) => fieldErrors(v, `${path}[${i}]`));
  return Object.entries(node).flatMap(([k, v]) => fieldErrors(v, path ? `${path}.${k}` : k));
}

function openNewDialog() {
  newForm.reset();
  syncKind();
  syncPolicy();
  newError.hidden = true;
  newDialog.showModal();
}

/** @param {FormData} data */
function deploymentBody(data) {
  const kind = data.get("kind");
  /** @type {Object<string, unknown>} */
  const body = { name: data.get("name"), kind, replicas: Number(data.get("replicas") || 1) };
  if (data.get("team")) body.team = data.get("team");
  if (kind === "mig") body.profile = data.get("profile");
  if (kind === "mps") {
    body.memory_mib = Number(data.get("memory_mib"));
    if (data.get("max_compute_percent"))
      body.max_compute_percent = Number(data.get("max_compute_percent"));
  }
  if (kind === "gpu") body.gpu_count = Number(data.get("gpu_count") || 1);
  const workload = workloadBody(data);
  if (workload) body.workload = workload;
  return body;
}

/** @param {SubmitEvent} e */
async function createDeployment(e) {
  e.preventDefault();
  const body = deploymentBody(new FormData(newForm));
  const result = await api("POST", "/api/v1/deployments/", body);
  if (!result.ok) {
    const details = result.data?.details || {};
    const problems = (details.problems || []).map(
      (/** @type {{field: string, message: string}} */ p) => `workload.${p.field}: ${p.message}`,
    );
    const fields = details.fields ? fieldErrors(details.fields) : problems;
    newError.textContent = [
      result.data?.message,
      ...violations(result.data).map((v) => v.message),
      ...fields,
    ]
      .filter(Boolean)
      .join(" · ");
    newError.hidden = false;
    return;
  }
  newDialog.close();
  toast(`Created ${body.name}`, { kind: "ok", lines: ["Drag it onto a GPU to place it."] });
  changes.tray = true;
  changes.flush();
}

/** Wires the tray's buttons and keys, and the new-deployment form. */
export function enableDialogs() {
  trayBox.addEventListener("click", (e) => {
    const button = /** @type {HTMLElement | null} */ (
      /** @type {Element} */ (e.target).closest("button[data-action]")
    );
    if (!button) return;
    const dep = /** @type {HTMLElement} */ (button.closest(".dep"));
    if (button.dataset.action === "place") openPlaceDialog(dep);
    else if (button.dataset.action === "evict") evict(dep);
    else if (button.dataset.action === "place-all")
      placeAll(dep, /** @type {HTMLButtonElement} */ (button));
    else if (button.dataset.action === "new-deployment") openNewDialog();
    else if (button.dataset.action === "wit")
      openWitDialog(`${dep.dataset.deployment}.next`, dep.dataset.name || "");
  });
  trayBox.addEventListener("keydown", (e) => {
    const target = /** @type {HTMLElement} */ (e.target);
    const dep = target.classList && target.classList.contains("dep") ? target : null;
    if (!dep) return;
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      if (dep.dataset.placeable === "1" && dep.draggable) openPlaceDialog(dep);
    } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      const all = /** @type {HTMLElement[]} */ ([...trayBox.querySelectorAll(".dep[tabindex]")]);
      all[all.indexOf(dep) + (e.key === "ArrowDown" ? 1 : -1)]?.focus();
    }
  });
  // A placed replica: focus it, Enter, then pick where it moves (the drag's alternative).
  hostsBox.addEventListener("keydown", (e) => {
    const replica = /** @type {HTMLElement} */ (e.target).closest?.(
      '[data-allocation][draggable="true"]',
    );
    if (!replica || (e.key !== "Enter" && e.key !== " ")) return;
    e.preventDefault();
    if (canDeploy) openPlaceDialog(/** @type {HTMLElement} */ (replica));
  });
  newForm.addEventListener("change", syncKind);
  teamSelect.addEventListener("change", syncPolicy);
  newForm.addEventListener("click", (e) => {
    if (/** @type {Element} */ (e.target).closest("[data-close]")) newDialog.close();
  });
  newForm.addEventListener("submit", createDeployment);
}
