// The fleet view: live telemetry on every card, re-rendered cards after changes, filters and
// search, the deployments tray with drag-and-drop (and its keyboard/click alternative).
import {
  api, canOperate, debounce, el, fmtMiB, fmtMiBPair, fmtNum, fmtPct, fragment, heatBucket, live, naTitle, swap,
  toast, toastError, violations,
} from "./core.js";

const hostsBox = document.getElementById("hosts");
const tray = document.getElementById("tray");
const filtersForm = document.getElementById("filters");
const latest = new Map(); // gpu id -> last telemetry values
const NA = naTitle();

// ---- telemetry painting: touch only the nodes whose value changed ------------------------------

const refsCache = new WeakMap();
function refs(card) {
  let found = refsCache.get(card);
  if (!found) {
    const slices = new Map();
    for (const node of card.querySelectorAll(".slice[data-partition]")) {
      slices.set(node.dataset.partition, { node, pu: node.querySelector('[data-live="pu"]') });
    }
    found = {
      util: card.querySelector('[data-live="util"]'),
      mem: card.querySelector('[data-live="mem"]'),
      temp: card.querySelector('[data-live="temp"]'),
      power: card.querySelector('[data-live="power"]'),
      memline: card.querySelector('[data-live="memline"]'),
      slices,
    };
    refsCache.set(card, found);
  }
  return found;
}

function setText(node, text) {
  if (node && node.textContent !== text) node.textContent = text;
}

function paint(gpuId, t) {
  const card = document.getElementById(`gpu-${gpuId}`);
  if (!card) return;
  const r = refs(card);
  const heat = heatBucket(t.utilization_percent);
  if (card.dataset.heat !== heat) card.dataset.heat = heat;
  setText(r.util, fmtPct(t.utilization_percent));
  const total = t.memory_total_mib ?? Number(card.dataset.memTotal);
  setText(r.mem, fmtMiBPair(t.memory_used_mib, total));
  setText(r.temp, fmtNum(t.temperature_c, "°C"));
  setText(r.power, fmtNum(t.power_w, " W"));
  if (r.memline && t.memory_used_mib != null && total) {
    r.memline.style.width = `${Math.min(100, (100 * t.memory_used_mib) / total).toFixed(1)}%`;
  }
  for (const [pid, values] of Object.entries(t.partitions || {})) {
    const slice = r.slices.get(pid);
    if (!slice) continue;
    const sliceHeat = heatBucket(values.utilization_percent);
    if (slice.node.dataset.heat !== sliceHeat) {
      slice.node.dataset.heat = sliceHeat;
      const base = slice.node.title.split(" · utilisation:")[0];
      slice.node.title = sliceHeat === "na" ? `${base} · utilisation: ${NA}` : base;
    }
    if (slice.pu) setText(slice.pu, values.utilization_percent == null ? "n/a" : fmtPct(values.utilization_percent));
  }
  if (t.health && card.dataset.health && t.health !== card.dataset.health) changes.add("gpu", [Number(gpuId)]);
}

// ---- which GPUs are on screen: the socket only sends their telemetry ----------------------------

const visibleHosts = new Set();
const announceVisible = debounce(() => {
  const ids = [];
  for (const host of visibleHosts) {
    for (const card of host.querySelectorAll(".gpu:not([hidden])")) ids.push(Number(card.dataset.gpu));
  }
  live.subscribe(ids);
}, 150);
const observer = new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (entry.isIntersecting) visibleHosts.add(entry.target);
    else visibleHosts.delete(entry.target);
  }
  announceVisible();
}, { rootMargin: "300px 0px" });
function observeHosts(root = hostsBox) {
  for (const host of root.querySelectorAll("section.host")) observer.observe(host);
}

// ---- changes: re-render the affected cards and tray from the server ---------------------------

const changes = {
  pending: { gpu: new Set(), partition: new Set(), allocation: new Set(), host: new Set() },
  tray: false,
  all: false,
  add(kind, ids) {
    if (kind in this.pending) ids.forEach((id) => this.pending[kind].add(id));
    this.flush();
  },
  flush: debounce(() => changes.run(), 80),
  async run() {
    const all = this.all;
    const params = new URLSearchParams();
    for (const [kind, ids] of Object.entries(this.pending)) {
      if (ids.size) params.set(kind, [...ids].join(","));
      ids.clear();
    }
    this.all = false;
    if (all) params.set("all", "1");
    if ([...params.keys()].length) await refreshCards(params);
    if (this.tray || all) {
      this.tray = false;
      await refreshTray();
    }
  },
};

async function refreshCards(params) {
  let content;
  try { content = await fragment(`/ui/cards?${params}`); } catch { return; }
  for (const section of content.querySelectorAll("section.host")) {
    const existing = document.getElementById(section.id);
    if (!existing) {
      hostsBox.append(section);
      observer.observe(section);
      continue;
    }
    swapHead(existing, section);
    const grid = existing.querySelector(".gpus");
    for (const card of [...section.querySelectorAll("article.gpu")]) {
      const old = document.getElementById(card.id);
      if (old) {
        if (swap(old, card)) afterSwap(card);
      } else {
        grid.append(card);
        afterSwap(card);
      }
    }
  }
  applyFilters(false);
}

function swapHead(existing, section) {
  const oldHead = existing.querySelector(".host-head");
  const newHead = section.querySelector(".host-head");
  if (oldHead && newHead && oldHead.innerHTML !== newHead.innerHTML) oldHead.replaceWith(newHead);
  existing.className = section.className;
}

function afterSwap(card) {
  const t = latest.get(card.dataset.gpu);
  if (t) paint(card.dataset.gpu, t);
  if (drag && drag.targets) markCard(card, drag.targets.get(Number(card.dataset.gpu)));
  if (card.classList.contains("is-applying") === false && settling.has(card.dataset.gpu)) {
    settling.delete(card.dataset.gpu);
  }
  card.classList.add("flash");
  setTimeout(() => card.classList.remove("flash"), 1300);
}

async function refreshTray() {
  if (drag) { changes.tray = true; return; } // never pull the card being dragged from under the pointer
  let content;
  try { content = await fragment("/ui/tray"); } catch { return; }
  const fresh = content.querySelector("#tray-list");
  const old = document.getElementById("tray-list");
  if (!fresh || !old) return;
  const sigs = (root) => [...root.querySelectorAll(".dep")].map((d) => d.id + d.dataset.sig).join();
  if (sigs(old) === sigs(fresh)) return;
  const focused = document.activeElement && document.activeElement.closest(".dep");
  const before = new Map([...old.querySelectorAll(".dep")].map((d) => [d.id, d.dataset.sig]));
  old.replaceWith(fresh);
  for (const dep of fresh.querySelectorAll(".dep")) {
    if (before.has(dep.id) && before.get(dep.id) !== dep.dataset.sig) dep.classList.add("settled");
  }
  document.querySelector(".tray-head .count").textContent = fresh.querySelectorAll(".dep").length;
  if (focused) document.getElementById(focused.id)?.focus();
}

live.on("frame", (frame) => {
  for (const [gpuId, values] of Object.entries(frame.telemetry || {})) {
    latest.set(gpuId, values);
    paint(gpuId, values);
  }
  if (frame.fleet) setText(document.getElementById("fleet-util"), fmtPct(frame.fleet.utilization_percent));
  const changed = frame.changed || {};
  for (const kind of ["gpu", "partition", "allocation", "host"]) {
    if (changed[kind]) changes.add(kind, changed[kind]);
  }
  if (changed.deployment || changed.allocation) { changes.tray = true; changes.flush(); }
  if (changed.operation) operations.changed(changed.operation);
});
live.on("resync", () => { changes.all = true; changes.flush(); });

// ---- operations this tab started: follow them until the agent settles them --------------------

const settling = new Map(); // gpu id -> operation id
const operations = {
  watched: new Map(), // id -> callback(operation)
  timer: null,
  watch(id, callback) {
    this.watched.set(id, callback);
    if (!this.timer) this.timer = setInterval(() => this.changed([...this.watched.keys()]), 4000);
  },
  async changed(ids) {
    for (const id of ids) {
      const callback = this.watched.get(id);
      if (!callback) continue;
      const result = await api("GET", `/api/v1/operations/${id}/`);
      if (!result.ok) continue;
      if (["succeeded", "failed", "expired"].includes(result.data.status)) {
        this.watched.delete(id);
        callback(result.data);
      }
    }
    if (!this.watched.size && this.timer) { clearInterval(this.timer); this.timer = null; }
  },
};

// ---- filters and search -----------------------------------------------------------------------

const serverFiltered = [...new URLSearchParams(location.search).values()].some(Boolean);
let loadedAll = !serverFiltered;

function filterValues() {
  const data = new FormData(filtersForm);
  return {
    q: (data.get("q") || "").toString().trim().toLowerCase(),
    mode: data.get("mode") || "",
    product: data.get("product") || "",
    health: data.get("health") || "",
    cordoned: data.get("cordoned") || "",
    free: data.get("free") || "",
  };
}

function matches(card, f) {
  const d = card.dataset;
  if (f.q && !f.q.split(/\s+/).every((term) => d.search.includes(term))) return false;
  if (f.mode && d.mode !== f.mode) return false;
  if (f.product && d.product !== f.product) return false;
  if (f.health && !["unhealthy", "lost"].includes(d.health)) return false;
  if (f.cordoned && d.cordoned !== "1") return false;
  if (f.free && d.free !== "1") return false;
  return true;
}

function applyFilters(updateUrl = true) {
  const f = filterValues();
  let shown = 0, total = 0;
  for (const host of hostsBox.querySelectorAll("section.host")) {
    let any = false;
    for (const card of host.querySelectorAll("article.gpu")) {
      const ok = matches(card, f);
      total += 1;
      if (ok) { shown += 1; any = true; }
      if (card.hidden === ok) card.hidden = !ok;
    }
    if (host.hidden === any) host.hidden = !any;
  }
  setText(document.getElementById("match-count"), shown === total ? `${total} GPUs` : `${shown} of ${total} GPUs`);
  if (updateUrl) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(f)) if (v) params.set(k, v);
    history.replaceState(null, "", params.toString() ? `?${params}` : location.pathname);
    announceVisible();
  }
}

async function onFilterInput() {
  if (!loadedAll) {
    loadedAll = true;
    const content = await fragment("/ui/cards?all=1");
    hostsBox.replaceChildren(content);
    observeHosts();
    for (const [id, t] of latest) paint(id, t);
  }
  applyFilters();
}
filtersForm.addEventListener("input", debounce(onFilterInput, 60));
filtersForm.addEventListener("submit", (e) => { e.preventDefault(); onFilterInput(); });
document.addEventListener("keydown", (e) => {
  if (e.key === "/" && !e.target.closest("input, textarea, select, dialog")) {
    e.preventDefault();
    document.getElementById("search").focus();
  }
});

// ---- drag-and-drop placement ------------------------------------------------------------------

let drag = null; // {id, name, targets: Map(gpu id -> info) | null}

/** Reads GET /deployments/{id}/targets into gpu id -> {fit, note, gpuFeasible, partitions}. */
async function loadTargets(deploymentId) {
  const result = await api("GET", `/api/v1/deployments/${deploymentId}/targets`);
  if (!result.ok || !result.data || !Array.isArray(result.data.feasible)) return null;
  const byGpu = new Map();
  const info = (gpu) => {
    if (!byGpu.has(gpu)) byGpu.set(gpu, { fit: false, gpuFeasible: null, gpuReasons: [], partitions: new Map(), best: null });
    return byGpu.get(gpu);
  };
  for (const entry of result.data.feasible) {
    const i = info(entry.gpu);
    i.fit = true;
    if (entry.partition == null) i.gpuFeasible = entry;
    else i.partitions.set(entry.partition, { fit: true, entry });
    if (!i.best || entry.score > i.best.score) i.best = entry;
  }
  for (const entry of result.data.infeasible || []) {
    const i = info(entry.gpu);
    const reasons = (entry.violations || []).map((v) => v.message);
    if (entry.partition == null) i.gpuReasons.push(...reasons);
    else i.partitions.set(entry.partition, { fit: false, reasons });
  }
  return byGpu;
}

function fitNote(i) {
  if (i.fit) {
    const entry = i.best;
    if (entry && entry.new_instance) return `Fits: new instance at slice ${entry.new_instance.start}`;
    if (entry && entry.partition != null) return "Fits on a free instance";
    return "Fits";
  }
  const first = i.gpuReasons[0] || [...i.partitions.values()].flatMap((p) => p.reasons || [])[0];
  return first || "Does not fit";
}

function markCard(card, i) {
  const note = card.querySelector(".fit-note");
  if (!i) { delete card.dataset.fit; if (note) note.textContent = ""; return; }
  card.dataset.fit = i.fit ? "yes" : "no";
  if (note) { note.textContent = fitNote(i); note.title = note.textContent; }
  for (const slice of card.querySelectorAll(".slice[data-partition]")) {
    const p = i.partitions.get(Number(slice.dataset.partition));
    if (p) {
      slice.dataset.fit = p.fit ? "yes" : "no";
      if (!p.fit) slice.dataset.why = (p.reasons || []).join(" ");
    } else delete slice.dataset.fit;
  }
}

function clearMarks() {
  for (const node of document.querySelectorAll("[data-fit]")) delete node.dataset.fit;
  for (const node of document.querySelectorAll(".fit-note")) node.textContent = "";
  for (const node of document.querySelectorAll(".drop-hover")) node.classList.remove("drop-hover");
}

function startDrag(dep) {
  drag = { id: Number(dep.dataset.deployment), name: dep.dataset.name, targets: null };
  document.body.classList.add("dragging");
  dep.classList.add("is-dragging");
  const id = drag.id;
  loadTargets(id).then((targets) => {
    if (!drag || drag.id !== id) return;
    drag.targets = targets;
    if (!targets) {
      toast("No fit preview", { lines: ["The server will check the fit when you drop."], timeout: 2500 });
      return;
    }
    for (const card of hostsBox.querySelectorAll("article.gpu:not([hidden])")) {
      markCard(card, targets.get(Number(card.dataset.gpu)));
    }
  });
}

function endDrag() {
  document.body.classList.remove("dragging");
  for (const node of document.querySelectorAll(".dep.is-dragging")) node.classList.remove("is-dragging");
  clearMarks();
  drag = null;
  if (changes.tray) refreshTray();
}

/** The API target for a drop on `card` (and maybe on one of its MIG slices). */
function targetFor(card, slice, targets) {
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

function describeTarget(card, target) {
  const where = card ? card.dataset.label : `GPU ${target.gpu}`;
  if (target.partition == null) return where;
  const slice = card && card.querySelector(`.slice[data-partition="${target.partition}"] .p`);
  return `${where} · ${slice ? slice.textContent : `partition ${target.partition}`}`;
}

/** POST /deployments/{id}/place, then follow the operation until the agent has applied it. */
async function place(deploymentId, name, target) {
  const card = document.getElementById(`gpu-${target.gpu ?? cardOfPartition(target.partition)?.dataset.gpu}`)
    || cardOfPartition(target.partition);
  const where = describeTarget(card, target);
  const result = await api("POST", `/api/v1/deployments/${deploymentId}/place`, target);
  if (!result.ok) {
    if (card) { card.classList.add("refused"); setTimeout(() => card.classList.remove("refused"), 500); }
    toastError(result, `${name} does not fit on ${where}`);
    return false;
  }
  const op = result.data;
  if (card) { card.classList.add("settling"); settling.set(card.dataset.gpu, op.id); }
  toast(`Placing ${name} on ${where}`, { lines: ["Waiting for the agent to apply it…"], timeout: 4000 });
  changes.tray = true;
  changes.add("gpu", card ? [Number(card.dataset.gpu)] : []);
  operations.watch(op.id, (done) => {
    const node = card && document.getElementById(card.id);
    if (node) node.classList.remove("settling");
    changes.tray = true;
    changes.add("gpu", card ? [Number(card.dataset.gpu)] : []);
    if (done.status === "succeeded") toast(`${name} is running on ${where}`, { kind: "ok", timeout: 4000 });
    else toast(`Placing ${name} ${done.status}`, { kind: "error", lines: [done.reason || "No reason given."], timeout: 10000 });
  });
  return true;
}

function cardOfPartition(pid) {
  if (pid == null) return null;
  const node = document.querySelector(`[data-partition="${pid}"]`);
  return node ? node.closest("article.gpu") : null;
}

if (canOperate) {
  tray.addEventListener("dragstart", (e) => {
    const dep = e.target.closest && e.target.closest('.dep[draggable="true"]');
    if (!dep) return;
    e.dataTransfer.setData("text/plain", `fleet-deployment:${dep.dataset.deployment}`);
    e.dataTransfer.effectAllowed = "move";
    startDrag(dep);
  });
  tray.addEventListener("dragend", endDrag);

  let hovered = null;
  hostsBox.addEventListener("dragover", (e) => {
    if (!drag) return;
    const card = e.target.closest("article.gpu");
    if (!card) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = "move";
    const slice = e.target.closest(".slice[data-partition]");
    const target = slice || card;
    if (hovered !== target) {
      hovered?.classList.remove("drop-hover");
      card.classList.add("drop-hover");
      if (slice) slice.classList.add("drop-hover");
      hovered = target;
    }
  });
  hostsBox.addEventListener("dragleave", (e) => {
    const card = e.target.closest && e.target.closest("article.gpu");
    if (card && !card.contains(e.relatedTarget)) card.classList.remove("drop-hover");
    if (hovered && !hovered.contains(e.relatedTarget)) { hovered.classList.remove("drop-hover"); hovered = null; }
  });
  hostsBox.addEventListener("drop", async (e) => {
    if (!drag) return;
    const card = e.target.closest("article.gpu");
    if (!card) return;
    e.preventDefault();
    const slice = e.target.closest(".slice[data-partition]");
    const { id, name, targets } = drag;
    const target = targetFor(card, slice, targets);
    endDrag();
    await place(id, name, target);
  });
}

// ---- the keyboard and click alternative: Place… lists every target with its verdict ------------

const placeDialog = document.getElementById("place-dialog");

async function openPlaceDialog(dep) {
  const id = Number(dep.dataset.deployment);
  const name = dep.dataset.name;
  placeDialog.querySelector("#place-title").textContent = `Place ${name}`;
  const list = placeDialog.querySelector("#place-targets");
  const sub = placeDialog.querySelector("#place-sub");
  list.replaceChildren(el("p", { class: "muted small" }, el("span", { class: "spinner" }), " Checking every GPU…"));
  sub.textContent = dep.querySelector(".chip")?.textContent || "";
  placeDialog.showModal();
  const targets = await loadTargets(id);
  const rows = [];
  const choose = async (target) => { placeDialog.close(); await place(id, name, target); dep.focus(); };
  if (targets) {
    const feasible = [];
    const infeasible = [];
    for (const [gpu, info] of targets) {
      const card = document.getElementById(`gpu-${gpu}`);
      const label = card ? card.dataset.label : `GPU ${gpu}`;
      if (info.fit) feasible.push({ gpu, info, label, card });
      else infeasible.push({ gpu, info, label });
    }
    feasible.sort((a, b) => (b.info.best?.score ?? 0) - (a.info.best?.score ?? 0));
    rows.push(el("h3", { text: `Fits (${feasible.length})` }));
    if (!feasible.length) rows.push(el("p", { class: "muted small", text: "No GPU can take it right now." }));
    for (const { gpu, info, label, card } of feasible.slice(0, 50)) {
      const target = info.gpuFeasible ? { gpu } : { partition: info.best.partition };
      rows.push(el("div", { class: "target" },
        el("div", {}, el("div", { class: "where", text: describeTarget(card, target) }),
          el("div", { class: "score", text: `${fitNote(info)} · score ${Number(info.best?.score ?? 0).toFixed(2)}` })),
        el("button", { type: "button", class: "btn small primary", onclick: () => choose(target), "data-gpu": gpu }, "Place here")));
    }
    rows.push(el("h3", { text: `Does not fit (${infeasible.length})` }));
    for (const { gpu, info, label } of infeasible.slice(0, 80)) {
      rows.push(el("div", { class: "target no", "data-gpu": gpu },
        el("div", {}, el("div", { class: "where", text: label }), el("div", { class: "why", text: fitNote(info) }))));
    }
  } else {
    rows.push(el("p", { class: "muted small", text: "No fit preview from the server: pick a GPU and the server checks the fit." }));
    for (const card of [...hostsBox.querySelectorAll("article.gpu:not([hidden])")].slice(0, 200)) {
      const gpu = Number(card.dataset.gpu);
      rows.push(el("div", { class: "target" }, el("div", { class: "where", text: `${card.dataset.label} · ${card.dataset.mode}` }),
        el("button", { type: "button", class: "btn small", onclick: () => choose({ gpu }) }, "Place here")));
    }
  }
  list.replaceChildren(...rows);
  list.querySelector("button")?.focus();
}

async function evict(dep) {
  const name = dep.dataset.name;
  if (!confirm(`Evict every replica of ${name}? Its workloads stop.`)) return;
  const result = await api("POST", `/api/v1/deployments/${dep.dataset.deployment}/evict`, {});
  if (!result.ok) { toastError(result, `Could not evict ${name}`); return; }
  toast(`Evicting ${name}`, { lines: [`${result.data.length} replica(s) released; the agents stop them.`] });
  changes.tray = true;
  changes.flush();
}

tray.addEventListener("click", (e) => {
  const button = e.target.closest("button[data-action]");
  if (!button) return;
  const dep = button.closest(".dep");
  if (button.dataset.action === "place") openPlaceDialog(dep);
  else if (button.dataset.action === "evict") evict(dep);
  else if (button.dataset.action === "new-deployment") openNewDialog();
});
tray.addEventListener("keydown", (e) => {
  const dep = e.target.classList && e.target.classList.contains("dep") ? e.target : null;
  if (!dep) return;
  if (e.key === "Enter" || e.key === " ") {
    e.preventDefault();
    if (dep.dataset.placeable === "1" && canOperate) openPlaceDialog(dep);
  } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
    e.preventDefault();
    const all = [...tray.querySelectorAll(".dep[tabindex]")];
    const next = all[all.indexOf(dep) + (e.key === "ArrowDown" ? 1 : -1)];
    next?.focus();
  }
});

// ---- new deployment ---------------------------------------------------------------------------

const newDialog = document.getElementById("new-dialog");
const newForm = document.getElementById("new-form");
function syncKind() {
  const kind = new FormData(newForm).get("kind");
  for (const label of newForm.querySelectorAll("[data-for]")) label.hidden = label.dataset.for !== kind;
}
function openNewDialog() {
  newForm.reset();
  syncKind();
  newForm.querySelector("#new-error").hidden = true;
  newDialog.showModal();
}
newForm.addEventListener("change", syncKind);
newForm.addEventListener("click", (e) => { if (e.target.closest("[data-close]")) newDialog.close(); });
newForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  const data = new FormData(newForm);
  const kind = data.get("kind");
  const body = { name: data.get("name"), kind, replicas: Number(data.get("replicas") || 1) };
  if (kind === "mig") body.profile = data.get("profile");
  if (kind === "mps") {
    body.memory_mib = Number(data.get("memory_mib"));
    if (data.get("max_compute_percent")) body.max_compute_percent = Number(data.get("max_compute_percent"));
  }
  if (kind === "gpu") body.gpu_count = Number(data.get("gpu_count") || 1);
  const result = await api("POST", "/api/v1/deployments/", body);
  const error = newForm.querySelector("#new-error");
  if (!result.ok) {
    const details = result.data?.details || {};
    const fields = Object.entries(details).filter(([k]) => k !== "violations").map(([k, v]) => `${k}: ${[].concat(v).join(" ")}`);
    error.textContent = [result.data?.message, ...violations(result.data).map((v) => v.message), ...fields].filter(Boolean).join(" · ");
    error.hidden = false;
    return;
  }
  newDialog.close();
  toast(`Created ${body.name}`, { kind: "ok", lines: ["Drag it onto a GPU to place it."] });
  changes.tray = true;
  changes.flush();
});

// ---- start ------------------------------------------------------------------------------------

observeHosts();
applyFilters(false);
live.start();
