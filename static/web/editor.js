// @ts-check
// The MIG layout editor: pick profiles into free placements, presets, instant validation by the
// server's MIG rules (POST /mig/validate), MPS inside instances, a drain warning, and Apply with
// live progress. The MPS limits, operation statuses and drain steps come from the page config.
import { confirmAction } from "./confirm.js";
import {
  api,
  canOperate,
  config,
  el,
  fmtMiB,
  followOperation,
  fragment,
  heatBucket,
  isFinal,
  live,
  swap,
  toast,
  toastError,
  violations,
} from "./core.js";

const page = document.getElementById("editor-page");
const gpuId = Number(page.dataset.gpu);
let model = JSON.parse(document.getElementById("editor-model").textContent);
let mode = model.mode;
// The layout being edited: {profile_id, start, mps} (mps: the policy inside the instance, or null).
const fromCurrent = () =>
  model.current.map((c) => ({
    profile_id: c.profile_id,
    start: c.start,
    mps: c.mps ? { ...c.mps } : null,
  }));
let instances = fromCurrent();
let validation = 0; // sequence number of the latest validation request
let validated = null; // what the latest validation was asked about (mode and instances)
let valid = false;
let followed = null; // the operation being followed
// Set when the followed operation succeeds: the next re-read adopts the applied layout as the
// edit. Only that one: a later live frame must not wipe an edit the operator has started since.
let adoptApplied = false;
let adoptedId = null; // the operation whose success was adopted (show() runs on every update)
let unfollow = () => {};

const $ = (id) => document.getElementById(id);
const profileOf = (id) => model.profiles.find((p) => p.id === id);
const sizeOf = (inst) => {
  const profile = profileOf(inst.profile_id);
  const placement = profile && profile.placements.find(([start]) => start === inst.start);
  return placement ? placement[1] : profile ? profile.memory_slices : 1;
};
const overlaps = (a, b) => a.start < b.start + sizeOf(b) && b.start < a.start + sizeOf(a);
const same = (a, b) => a.profile_id === b.profile_id && a.start === b.start;
const key = (i) => `${i.profile_id}@${i.start}`;
const samePolicy = (a, b) => JSON.stringify(a || null) === JSON.stringify(b || null);
/** An instance as it would be kept: a slot of the current layout keeps its MPS policy. */
const keeping = (inst) => {
  const kept = model.current.find((c) => same(c, inst));
  return { ...inst, mps: kept && kept.mps ? { ...kept.mps } : inst.mps || null };
};

function destroyed() {
  if (mode !== "mig") return model.current;
  return model.current.filter((c) => !instances.some((i) => same(i, c)));
}

function busyLosses() {
  const lost = destroyed()
    .filter((c) => c.busy.length)
    .map((c) => ({
      what: `${c.profile} at slice${c.size > 1 ? "s" : ""} ${c.start}${c.size > 1 ? `–${c.start + c.size - 1}` : ""}`,
      busy: c.busy,
    }));
  if (mode === "mig" && model.mode !== "mig" && model.whole_busy.length) {
    lost.push({ what: "the whole-GPU partition", busy: model.whole_busy });
  }
  return lost;
}

// The mode tabs by their role: the GPU card in the aside carries a data-mode of its own.
const MODE_TABS = '.mode-tabs [role="tab"]';
const tabs = () =>
  /** @type {NodeListOf<HTMLButtonElement>} */ (document.querySelectorAll(MODE_TABS));

// ---- drawing ----------------------------------------------------------------------------------

function drawCanvas() {
  const canvas = $("canvas");
  const n = model.slice_count;
  const nodes = [];
  for (let c = 0; c < n; c++)
    nodes.push(el("div", { class: "cellbg", style: `grid-column:${c + 1}` }));
  for (const inst of [...instances].sort((a, b) => a.start - b.start)) {
    const profile = profileOf(inst.profile_id);
    const kept = model.current.find((c) => same(c, inst));
    const size = sizeOf(inst);
    const sub = kept
      ? kept.busy.length
        ? kept.busy.join(", ")
        : "kept · free"
      : `new · ${fmtMiB(profile.memory_mib)}`;
    nodes.push(
      el(
        "div",
        {
          class: `inst ${kept ? "kept" : "new"}${kept && kept.busy.length ? " busy" : ""}`,
          style: `grid-column:${inst.start + 1} / span ${size}`,
          "data-instance": key(inst),
          title: `${profile.name} · slices ${inst.start}–${inst.start + size - 1} · ${fmtMiB(profile.memory_mib)}`,
        },
        el("span", { class: "nm", text: profile.name }),
        el("span", { class: "sub", text: sub }),
        canOperate
          ? el(
              "button",
              {
                type: "button",
                class: "rm",
                "aria-label": `Remove ${profile.name} at slice ${inst.start}`,
                onclick: () => remove(inst),
              },
              "×",
            )
          : null,
      ),
    );
  }
  for (const lost of destroyed().filter((c) => c.busy.length)) {
    nodes.push(
      el(
        "div",
        {
          class: "ghost-destroyed",
          style: `grid-column:${lost.start + 1} / span ${lost.size}`,
          title: `Would destroy ${lost.profile} running ${lost.busy.join(", ")}`,
        },
        `✕ ${lost.profile}: ${lost.busy.join(", ")}`,
      ),
    );
  }
  canvas.replaceChildren(...nodes);
  canvas.style.gridAutoRows = destroyed().some((c) => c.busy.length) ? "78px 26px" : "78px";
}

function drawPalette() {
  const palette = $("palette");
  const rows = model.profiles.map((profile) => {
    const count = instances.filter((i) => i.profile_id === profile.id).length;
    const track = el("div", { class: "prow-track", style: `--n:${model.slice_count}` });
    // Placements of one profile can overlap one another: stack those on extra rows.
    const lanes = [];
    for (const [start, size] of profile.placements) {
      const candidate = { profile_id: profile.id, start };
      let lane = lanes.findIndex((taken) =>
        taken.every(([s, z]) => start >= s + z || s >= start + size),
      );
      if (lane === -1) {
        lanes.push([]);
        lane = lanes.length - 1;
      }
      lanes[lane].push([start, size]);
      const on = instances.some((i) => same(i, candidate));
      const blocked = !on && instances.some((i) => overlaps(i, { profile_id: profile.id, start }));
      const label = `${profile.name} at slice ${start}`;
      track.append(
        el(
          "button",
          {
            type: "button",
            class: `pl${on ? " on" : ""}`,
            style: `grid-column:${start + 1} / span ${size}; grid-row:${lane + 1}`,
            disabled: !canOperate || blocked,
            title: on
              ? `Remove ${label}`
              : blocked
                ? `${label}: overlaps an instance`
                : `Add ${label}`,
            "aria-pressed": on ? "true" : "false",
            "aria-label": `${profile.name} @${start}`,
            "data-profile": profile.name,
            "data-start": start,
            onclick: () => (on ? remove(candidate) : add(candidate)),
          },
          `@${start}`,
        ),
      );
    }
    return el(
      "div",
      { class: "prow" },
      el(
        "div",
        {},
        el("div", { class: "pname", text: profile.name }),
        el("div", {
          class: "pmeta",
          text: `${profile.compute_slices} compute · ${fmtMiB(profile.memory_mib)} · ${count}/${profile.max_instances}${profile.media ? ` · ${profile.media}` : ""}`,
        }),
      ),
      track,
    );
  });
  palette.replaceChildren(...rows);
}

function drawRuler() {
  const ruler = $("ruler");
  ruler.replaceChildren(
    ...Array.from({ length: model.slice_count }, (_, i) => el("span", { text: i })),
  );
}

function drawDiff() {
  const diff = $("diff");
  if (mode !== "mig") {
    diff.replaceChildren();
    return;
  }
  const added = instances.filter((i) => !model.current.some((c) => same(c, i)));
  const gone = destroyed();
  const kept = model.current.length - gone.length;
  const mpsChanged = instances.filter((i) => {
    const c = model.current.find((k) => same(k, i));
    return c && !samePolicy(c.mps, i.mps);
  });
  const parts = [
    ...added.map((i) =>
      el("span", {
        class: "add",
        text: `+ ${profileOf(i.profile_id).name}@${i.start}${i.mps ? " (MPS)" : ""}`,
      }),
    ),
    ...gone.map((c) => el("span", { class: "del", text: `− ${c.profile}@${c.start}` })),
    ...mpsChanged.map((i) =>
      el("span", {
        class: "add",
        text: `~ ${profileOf(i.profile_id).name}@${i.start}: MPS ${i.mps ? "on" : "off"}`,
      }),
    ),
  ];
  if (!added.length && !gone.length && !mpsChanged.length)
    parts.push(
      el("span", { class: "keep", text: "No change yet: pick profiles below, or a preset" }),
    );
  else if (kept) parts.push(el("span", { class: "keep", text: `= ${kept} kept` }));
  diff.replaceChildren(...parts);
}

// ---- MPS inside instances ------------------------------------------------------------------

const LIMITS = config.mps_limits; // {field: {min, max}}: the bounds the server checks
const FULL_DEVICE = LIMITS.default_active_thread_percentage.max; // the driver's default
const MPS_FIELDS = [
  // [field, label, placeholder]
  ["default_active_thread_percentage", "Thread %", String(FULL_DEVICE)],
  ["default_pinned_mem_limit_mib", "Pinned MiB", "none"],
  ["max_clients", "Clients", "auto"],
];

/** One row per instance of the new layout: MPS on or off inside it, and its limits. */
function drawInstanceMps() {
  const box = $("inst-mps");
  if (!box) return;
  if (!instances.length) {
    box.replaceChildren(el("p", { class: "muted small", text: "No instances in the new layout." }));
    return;
  }
  const rows = [...instances]
    .sort((a, b) => a.start - b.start)
    .map((inst) => {
      const name = `${profileOf(inst.profile_id).name}@${inst.start}`;
      const inputs = MPS_FIELDS.map(([field, label, placeholder]) =>
        el(
          "label",
          {},
          label,
          el("input", {
            type: "number",
            min: LIMITS[field].min,
            max: LIMITS[field].max,
            placeholder,
            name: field,
            "data-instance": key(inst),
            value: inst.mps && inst.mps[field] != null ? String(inst.mps[field]) : "",
            disabled: !canOperate || !inst.mps,
            onchange: (e) => setMpsField(inst, field, e.target.value),
          }),
        ),
      );
      return el(
        "div",
        { class: "inst-mps-row", "data-instance": key(inst) },
        el(
          "div",
          { class: "inst-mps-name" },
          el("span", { class: "mono", text: name }),
          el(
            "label",
            { class: "toggle" },
            el("input", {
              type: "checkbox",
              checked: !!inst.mps,
              disabled: !canOperate,
              "data-instance": key(inst),
              "aria-label": `MPS inside ${name}`,
              onchange: (e) => setMps(inst, e.target.checked),
            }),
            el("span", { text: inst.mps ? "MPS on" : "MPS off" }),
          ),
        ),
        ...inputs,
      );
    });
  box.replaceChildren(...rows);
}

function setMps(inst, on) {
  const found = instances.find((i) => same(i, inst));
  if (!found) return;
  found.mps = on
    ? {
        default_active_thread_percentage: FULL_DEVICE,
        default_pinned_mem_limit_mib: null,
        max_clients: null,
      }
    : null;
  drawInstanceMps();
  edited();
}

function setMpsField(inst, field, raw) {
  const found = instances.find((i) => same(i, inst));
  if (!found || !found.mps) return;
  const value = raw === "" ? null : Number(raw);
  found.mps[field] =
    field === "default_active_thread_percentage" && value == null ? FULL_DEVICE : value;
  edited();
}

/** A change that leaves the instances where they are: no redraw of the form being typed in. */
function edited() {
  drawDiff();
  updateApply();
}

function drawDrain() {
  const box = $("drain");
  const lost = busyLosses();
  box.hidden = !lost.length;
  if (!lost.length) return;
  box.replaceChildren(
    el(
      "div",
      {},
      el("strong", { text: "This change needs a drain." }),
      el(
        "ul",
        {},
        lost.map((l) =>
          el(
            "li",
            {},
            `${l.what} runs ${l.busy.join(", ")}: applying would destroy it. Evict or move these workloads first.`,
          ),
        ),
      ),
    ),
  );
}

function changed() {
  if (mode !== model.mode) return true;
  if (mode !== "mig") return true; // MPS policy edits: the server says when nothing changes
  return (
    instances.length !== model.current.length ||
    instances.some((i) => !model.current.some((c) => same(c, i) && samePolicy(c.mps, i.mps)))
  );
}

function drawCurrentMode() {
  const node = $("current-mode");
  if (!node) return;
  const n = model.current.length;
  node.textContent =
    model.mode === "mig"
      ? `Current: MIG, ${n} instance${n === 1 ? "" : "s"}`
      : `Current: ${model.mode === "mps" ? "MPS" : "dedicated"}`;
}

function render() {
  drawCurrentMode();
  if (model.slice_count) {
    drawRuler();
    drawCanvas();
    drawPalette();
    drawDiff();
    drawInstanceMps();
  }
  drawDrain();
  for (const pane of /** @type {NodeListOf<HTMLElement>} */ (
    document.querySelectorAll("[data-pane]")
  ))
    pane.hidden = pane.dataset.pane !== mode;
  for (const tab of tabs()) tab.setAttribute("aria-selected", String(tab.dataset.mode === mode));
  validate();
}

// ---- validation: the server's MIG rules, whenever the instances change -------------------------

async function validate() {
  const asked = JSON.stringify([
    mode,
    mode === "mig" ? instances.map((i) => [i.profile_id, i.start]) : null,
  ]);
  if (asked === validated) {
    updateApply();
    return;
  } // the verdict on screen is still the answer
  validated = asked;
  const seq = ++validation;
  const verdict = $("verdict");
  if (mode !== "mig") {
    valid = true;
    const text =
      mode === "mps"
        ? "MPS: one control daemon for the whole GPU. The server checks the policy when you apply."
        : "Dedicated: the whole GPU for one workload.";
    setVerdict("ok", [el("span", { text })]);
    updateApply();
    return;
  }
  verdict.className = "verdict wait";
  const body = {
    gpu: gpuId,
    instances: instances.map((i) => ({ profile: i.profile_id, start: i.start })),
  };
  const result = await api("POST", "/api/v1/mig/validate", body);
  if (seq !== validation) return; // a newer edit superseded this answer
  if (!result.ok) {
    valid = false;
    validated = null; // ask again on the next render
    setVerdict("bad", [el("strong", { text: result.data?.message || "Validation failed" })]);
  } else if (result.data.valid) {
    valid = true;
    const compute = instances.reduce((sum, i) => sum + profileOf(i.profile_id).compute_slices, 0);
    const memory = instances.reduce((sum, i) => sum + sizeOf(i), 0);
    setVerdict("ok", [
      el("strong", { text: "Valid layout." }),
      ` ${instances.length} instance${instances.length === 1 ? "" : "s"} · ${memory}/${model.slice_count} memory slices · ${compute} compute slices.`,
    ]);
  } else {
    valid = false;
    setVerdict("bad", [
      el("strong", { text: "Not a valid layout:" }),
      el(
        "ul",
        {},
        result.data.violations.map((v) =>
          el("li", {}, `${v.message} `, el("code", { text: v.code })),
        ),
      ),
    ]);
  }
  updateApply();
}

function setVerdict(kind, children) {
  const verdict = $("verdict");
  verdict.className = `verdict ${kind}`;
  verdict.replaceChildren(el("div", {}, ...children));
}

function updateApply() {
  const button = /** @type {HTMLButtonElement} */ ($("apply"));
  const drain = /** @type {HTMLButtonElement} */ ($("drain-apply"));
  if (!canOperate) return;
  const busy = followed && !isFinal(followed.status);
  const needsDrain = busyLosses().length > 0;
  button.disabled = !valid || !changed() || busy || needsDrain;
  button.textContent = busy ? "Applying…" : needsDrain ? "Apply (needs a drain)" : "Apply layout";
  drain.hidden = !needsDrain;
  drain.disabled = !valid || busy;
  drain.classList.toggle("primary", needsDrain);
}

// ---- edits ------------------------------------------------------------------------------------

function add(inst) {
  instances = [...instances, keeping(inst)];
  render();
}
function remove(inst) {
  instances = instances.filter((i) => !same(i, inst));
  render();
}

$("presets")?.addEventListener("click", (e) => {
  const button = /** @type {HTMLElement | null} */ (
    /** @type {Element} */ (e.target).closest("[data-preset]")
  );
  if (!button || !canOperate) return;
  const name = button.dataset.preset;
  if (name === "current") instances = fromCurrent();
  else if (name === "empty") instances = [];
  else
    instances = model.presets
      .find((p) => p.key === name)
      .instances.map((i) => keeping({ ...i, mps: null }));
  render();
});

for (const tab of tabs()) {
  tab.addEventListener("click", () => {
    if (!tab.disabled) {
      mode = tab.dataset.mode;
      render();
    }
  });
}

// ---- apply and follow the operation -----------------------------------------------------------

function layoutBody() {
  if (mode === "mig") {
    return {
      mode,
      instances: instances.map((i) => ({
        profile: i.profile_id,
        start: i.start,
        ...(i.mps ? { mps: i.mps } : {}),
      })),
    };
  }
  if (mode === "dedicated") return { mode };
  const form = $("mps-form");
  const mps = {};
  for (const input of form.querySelectorAll("input"))
    if (input.value !== "") mps[input.name] = Number(input.value);
  return { mode, mps };
}

$("apply").addEventListener("click", async () => {
  const result = await api("PUT", `/api/v1/gpus/${gpuId}/layout`, layoutBody());
  if (!result.ok) {
    toastError(result, "Layout refused");
    const lines = violations(result.data).map((v) =>
      el("li", {}, `${v.message} `, el("code", { text: v.code })),
    );
    const busy = (result.data?.details?.busy || []).map((b) =>
      el("li", {}, `${b.label}: ${b.deployments.join(", ")}`),
    );
    setVerdict("bad", [
      el("strong", { text: result.data?.message || `Refused (${result.status})` }),
      lines.length || busy.length ? el("ul", {}, ...lines, ...busy) : null,
    ]);
    return;
  }
  follow(result.data);
});

$("drain-apply").addEventListener("click", async () => {
  const lost = busyLosses().flatMap((l) => l.busy);
  const sure = await confirmAction({
    title: "Drain this GPU?",
    impact: `${lost.length} busy partition${lost.length === 1 ? " moves" : "s move"} to other capacity (${lost.join(", ")}), or stop${lost.length === 1 ? "s" : ""} if none fits; then the new layout is applied.`,
    action: "Drain and apply",
  });
  if (!sure) return;
  const result = await api("POST", `/api/v1/gpus/${gpuId}/drain`, { layout: layoutBody() });
  if (!result.ok) {
    toastError(result, "Drain refused");
    return;
  }
  follow(result.data);
});

const DRAIN_STEPS = config.drain_steps; // step -> how the progress line words it

/** Shows `operation`'s progress and follows it until it is over (core.followOperation). */
function follow(operation) {
  unfollow();
  show(operation);
  unfollow = followOperation(operation, show);
}

function show(operation) {
  followed = operation;
  const steps = $("steps");
  steps.hidden = false;
  const order = ["pending", "dispatched", "succeeded"];
  const reached = operation.status === "succeeded" ? 3 : operation.status === "dispatched" ? 2 : 1;
  for (const step of /** @type {NodeListOf<HTMLElement>} */ (steps.querySelectorAll(".st"))) {
    const index = order.indexOf(step.dataset.step);
    step.className = "st";
    if (index < reached) step.classList.add("done");
    if (index === reached - 1 && operation.status !== "succeeded") step.classList.add("now");
    if (
      isFinal(operation.status) &&
      operation.status !== "succeeded" &&
      step.dataset.step === "succeeded"
    ) {
      step.classList.add("fail");
      step.textContent = operation.status === "failed" ? "Failed" : "Expired";
    } else if (step.dataset.step === "succeeded") step.textContent = "Applied";
  }
  const note = $("op-note");
  const drainStep = operation.kind === "drain" && operation.payload && operation.payload.step;
  const over = isFinal(operation.status);
  if (drainStep && !over) {
    note.textContent = `Drain #${operation.id}: ${DRAIN_STEPS[drainStep] || drainStep}…`;
    updateApply();
    return;
  }
  note.textContent =
    operation.status === "succeeded"
      ? operation.reason || "The agent applied the layout."
      : over
        ? operation.reason || ""
        : `Operation #${operation.id}: waiting for the agent…`;
  updateApply();
  if (operation.status === "succeeded" && operation.id !== adoptedId) {
    adoptedId = operation.id;
    adoptApplied = true;
    reload();
    toast("Layout applied", { kind: "ok", lines: [operation.summary] });
  } else if (over) {
    reload();
    toast(`Layout ${operation.status}`, {
      kind: "error",
      lines: [operation.reason || operation.summary],
      timeout: 0,
    });
  }
}

/** Re-reads the GPU: the drawing of what is on it now, and the editor's baseline. */
async function reload() {
  try {
    const content = await fragment(`/ui/cards?gpu=${gpuId}`);
    const fresh = content.querySelector(`#gpu-${gpuId}`);
    swap(document.getElementById(`gpu-${gpuId}`), fresh);
  } catch {
    /* the next change or re-sync redraws it */
  }
  const result = await api("GET", `/ui/gpus/${gpuId}/editor`);
  if (result.ok) {
    const wasCurrent = !changed();
    model = result.data;
    if (wasCurrent || adoptApplied) {
      adoptApplied = false;
      mode = model.mode;
      instances = fromCurrent();
    }
    render();
  }
}

live.on("frame", (frame) => {
  const c = frame.changed || {};
  if ((c.gpu || []).includes(gpuId) || c.partition || c.allocation) reload();
  const t = (frame.telemetry || {})[gpuId];
  const card = document.getElementById(`gpu-${gpuId}`);
  if (t && card) {
    card.dataset.heat = heatBucket(t.utilization_percent);
    for (const [pid, v] of Object.entries(t.partitions || {})) {
      const slice = /** @type {HTMLElement | null} */ (
        card.querySelector(`.slice[data-partition="${pid}"]`)
      );
      if (slice) slice.dataset.heat = heatBucket(v.utilization_percent);
    }
  }
});
live.on("hello", () => live.subscribe([gpuId]));
live.on("resync", () => reload()); // core re-reads the followed operation itself

render();
live.start();
