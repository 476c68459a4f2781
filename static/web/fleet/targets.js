// @ts-check
// The fit preview of a deployment: GET /deployments/{id}/targets read per GPU, marked on the
// cards while dragging and listed in the Place dialog, and the API target a drop stands for.
import { api, el } from "../core.js";
import { gpuIdsIn, gpuName, learnGpuNames, reasonText } from "../names.js";

/** @typedef {import("./state.js").TargetInfo} TargetInfo */

/**
 * Reads GET /deployments/{id}/targets into GPU id -> {fit, gpuFeasible, gpuReasons, partitions,
 * best}; null when the server has no preview.
 * @param {number} deploymentId
 * @returns {Promise<Map<number, TargetInfo> | null>}
 */
export async function loadTargets(deploymentId) {
  const result = await api("GET", `/api/v1/deployments/${deploymentId}/targets`);
  if (!result.ok || !result.data || !Array.isArray(result.data.feasible)) return null;
  /** @type {Map<number, TargetInfo>} */
  const byGpu = new Map();
  /** @param {number} gpu @returns {TargetInfo} */
  const info = (gpu) => {
    let found = byGpu.get(gpu);
    if (!found) {
      found = { fit: false, gpuFeasible: null, gpuReasons: [], partitions: new Map(), best: null };
      byGpu.set(gpu, found);
    }
    return found;
  };
  for (const entry of result.data.feasible) {
    const i = info(entry.gpu);
    i.fit = true;
    if (entry.partition == null) i.gpuFeasible = entry;
    else i.partitions.set(entry.partition, { fit: true, entry });
    if (!i.best || entry.score > i.best.score) i.best = entry;
  }
  // Name every GPU the preview lists or a refusal cites (a host not drawn yet has no card).
  const infeasible = result.data.infeasible || [];
  await learnGpuNames([
    ...result.data.feasible.map((/** @type {{gpu: number}} */ e) => e.gpu),
    ...infeasible.map((/** @type {{gpu: number}} */ e) => e.gpu),
    ...infeasible.flatMap((/** @type {{violations?: {message: string}[]}} */ e) =>
      (e.violations || []).flatMap((v) => gpuIdsIn(v.message)),
    ),
  ]);
  for (const entry of infeasible) {
    const i = info(entry.gpu);
    i.violation = i.violation || (entry.violations || [])[0] || null;
    const reasons = (entry.violations || []).map(reasonText);
    if (entry.partition == null) i.gpuReasons.push(...reasons);
    else i.partitions.set(entry.partition, { fit: false, reasons });
  }
  // The team's quota refuses every drop, whatever room the GPUs have: say so on each of them.
  const quota = (result.data.quota || []).map(reasonText);
  if (quota.length) {
    for (const i of byGpu.values()) {
      i.violation = result.data.quota[0];
      Object.assign(i, {
        fit: false,
        best: null,
        gpuFeasible: null,
        gpuReasons: [...quota, ...i.gpuReasons],
      });
      for (const key of i.partitions.keys()) i.partitions.set(key, { fit: false, reasons: quota });
    }
  }
  return byGpu;
}

/**
 * The GPUs that do not fit, grouped by their reason, the largest group first: each group's
 * sentence said of all its GPUs ("Each of 72 GPUs is split into MIG slices; …") and their ids.
 * @param {Map<number, TargetInfo>} targets
 * @returns {{sentence: string, gpus: number[]}[]}
 */
export function refusalGroups(targets) {
  /** @type {Map<string, {violation: any, gpus: number[]}>} */
  const groups = new Map();
  for (const [gpu, i] of targets) {
    if (i.fit) continue;
    const key = fitNote(i);
    const group = groups.get(key) || { violation: i.violation, gpus: [] };
    group.gpus.push(gpu);
    groups.set(key, group);
  }
  return [...groups]
    .sort(([, a], [, b]) => b.gpus.length - a.gpus.length)
    .map(([note, { violation, gpus }]) => {
      const many = violation ? reasonText(violation, gpus.length) : note;
      const said = gpus.length > 1 && many === note ? `${gpus.length} GPUs: ${note}` : many;
      return { sentence: gpus.length > 1 ? said : note, gpus };
    });
}

/**
 * The "Does not fit" part of the Place and Move dialogs: one group per reason (its GPUs by name,
 * folded), the largest first.
 * @param {Map<number, TargetInfo>} targets
 */
export function refusalList(targets) {
  const groups = refusalGroups(targets);
  const count = groups.reduce((n, g) => n + g.gpus.length, 0);
  const rows = [el("h3", { text: `Does not fit (${count})` })];
  for (const { sentence, gpus } of groups.slice(0, 20)) {
    const names = gpus.slice(0, 80).map((gpu) => {
      const card = /** @type {HTMLElement | null} */ (document.getElementById(`gpu-${gpu}`));
      const where = card?.dataset.label || gpuName(gpu) || "a GPU not on this page";
      return el("li", { class: "target no", "data-gpu": gpu, text: where });
    });
    rows.push(
      el(
        "details",
        { class: "target-group" },
        el("summary", {}, el("span", { class: "why", text: sentence })),
        el("ul", { class: "target-names" }, ...names),
      ),
    );
  }
  return rows;
}

/** One line on whether (and where) it fits, or the first reason it does not. @param {TargetInfo} i */
export function fitNote(i) {
  if (i.fit) {
    const entry = i.best;
    if (entry && entry.new_instance)
      return `Fits: new instance at slice ${entry.new_instance.start}`;
    if (entry && entry.partition != null) return "Fits on a free instance";
    return "Fits";
  }
  const first = i.gpuReasons[0] || [...i.partitions.values()].flatMap((p) => p.reasons || [])[0];
  return first || "Does not fit";
}

/** Marks a card (and its slices) with the preview's verdict. @param {HTMLElement} card @param {TargetInfo | undefined} i */
export function markCard(card, i) {
  const note = /** @type {HTMLElement | null} */ (card.querySelector(".fit-note"));
  if (!i) {
    delete card.dataset.fit;
    if (note) note.textContent = "";
    return;
  }
  card.dataset.fit = i.fit ? "yes" : "no";
  if (note) {
    note.textContent = fitNote(i);
    note.title = note.textContent;
  }
  for (const slice of /** @type {NodeListOf<HTMLElement>} */ (
    card.querySelectorAll(".slice[data-partition]")
  )) {
    const p = i.partitions.get(Number(slice.dataset.partition));
    if (p) {
      slice.dataset.fit = p.fit ? "yes" : "no";
      if (!p.fit) slice.dataset.why = (p.reasons || []).join(" ");
    } else delete slice.dataset.fit;
  }
}

export function clearMarks() {
  for (const node of /** @type {NodeListOf<HTMLElement>} */ (
    document.querySelectorAll("[data-fit]")
  ))
    delete node.dataset.fit;
  for (const node of document.querySelectorAll(".fit-note")) node.textContent = "";
  for (const node of document.querySelectorAll(".drop-hover")) node.classList.remove("drop-hover");
}

/**
 * The API target for a drop on `card` (and maybe on one of its MIG slices).
 * @param {HTMLElement} card
 * @param {HTMLElement | null} slice
 * @param {Map<number, TargetInfo> | null} targets
 * @returns {{gpu?: number, partition?: number}}
 */
export function targetFor(card, slice, targets) {
  const gpu = Number(card.dataset.gpu);
  const info = targets ? targets.get(gpu) : null;
  if (slice) {
    const pid = Number(slice.dataset.partition);
    const p = info && info.partitions.get(pid);
    if (p && p.fit) return { partition: pid };
    if (info && info.gpuFeasible) return { gpu };
    if (!info || !info.fit) return { partition: pid }; // the server says why not
  }
  if (info && !info.gpuFeasible && info.best && info.best.partition != null) {
    return { partition: info.best.partition };
  }
  return { gpu };
}

/** The card holding MIG partition `pid`, if it is on the page. @param {number | null | undefined} pid */
export function cardOfPartition(pid) {
  if (pid == null) return null;
  const node = document.querySelector(`[data-partition="${pid}"]`);
  return node ? /** @type {HTMLElement | null} */ (node.closest("article.gpu")) : null;
}

/**
 * `host/gpuN`, and the slice for a partition target.
 * @param {HTMLElement | null} card
 * @param {{gpu?: number, partition?: number}} target
 * @param {number | null} [gpu] the target's GPU, when the caller knows it
 */
export function describeTarget(card, target, gpu = null) {
  // Without its card on the page (a host not drawn yet), its name as the server gave it; never
  // "GPU undefined", never a bare id.
  const id = target.gpu ?? gpu;
  const where = card?.dataset.label || (id != null ? gpuName(id) : null) || "the chosen GPU";
  if (target.partition == null) return where;
  const slice = card && card.querySelector(`.slice[data-partition="${target.partition}"] .p`);
  // A MIG slice is named as its card shows it; an MPS share or a whole GPU is the GPU itself.
  return slice ? `${where} · ${slice.textContent}` : where;
}
