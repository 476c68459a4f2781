// @ts-check
// GPU detail: live charts of the last hour (inline SVG), the latest values, the partition table,
// events and operations re-rendered by the server after each change, and cordon/uncordon.
import {
  api,
  debounce,
  fmtMiB,
  fmtMiBPair,
  fmtNum,
  fmtPct,
  heatBucket,
  live,
  naTitle,
  refreshParts,
  toast,
  toastError,
} from "./core.js";

const page = document.getElementById("gpu-page");
const gpuId = Number(page.dataset.gpu);
const memTotal = Number(page.dataset.memTotal);
const history = JSON.parse(document.getElementById("history").textContent);
const WIDTH = 600,
  HEIGHT = 120;
let WINDOW_S = 3600;
const HISTORY_S = 3600;
const points = history.points; // [{t, utilization_percent, memory_used_mib, temperature_c, power_w}]
let longPoints = null; // 24 h / 7 d: the per-minute history from the API, not live
const LIVE_NOTE = "live, one point per second; gaps where NVML had no value";
let latest = null;
const NA = naTitle();

// ---- charts -----------------------------------------------------------------------------------

function pathsFor(key, yMax, t0) {
  let line = "",
    area = "",
    segment = [];
  const flush = () => {
    if (!segment.length) return;
    line += "M" + segment.map(([x, y]) => `${x},${y}`).join(" L") + " ";
    area +=
      `M${segment[0][0]},${HEIGHT} L` +
      segment.map(([x, y]) => `${x},${y}`).join(" L") +
      ` L${segment[segment.length - 1][0]},${HEIGHT} Z `;
    segment = [];
  };
  for (const p of series()) {
    if (p.t < t0) continue;
    const v = p[key];
    if (v === null || v === undefined) {
      flush();
      continue;
    }
    const x = (((p.t - t0) / WINDOW_S) * WIDTH).toFixed(1);
    const y = (HEIGHT - (Math.min(v, yMax) / yMax) * HEIGHT).toFixed(1);
    segment.push([x, y]);
  }
  flush();
  return { line, area };
}

function series() {
  return WINDOW_S > HISTORY_S && longPoints ? longPoints : points;
}

function formatValue(key, v) {
  if (v === null || v === undefined) return "n/a";
  if (key === "memory_used_mib") return fmtMiB(v);
  if (key === "utilization_percent") return fmtPct(v);
  return fmtNum(v, key === "temperature_c" ? " °C" : " W");
}

function drawCharts(now) {
  const t0 = now - WINDOW_S;
  while (points.length && points[0].t < now - HISTORY_S - 10) points.shift();
  for (const figure of document.querySelectorAll(/** @type {"figure"} */ ("figure[data-chart]"))) {
    const key = figure.dataset.chart;
    const base = Number(figure.dataset.ymax);
    const values = series()
      .filter((p) => p.t >= t0)
      .map((p) => p[key])
      .filter((v) => v !== null && v !== undefined);
    const yMax =
      key === "utilization_percent"
        ? 100
        : key === "memory_used_mib"
          ? memTotal
          : Math.max(base, ...values.map((v) => v * 1.1));
    const { line, area } = pathsFor(key, yMax, t0);
    figure.querySelector("path.line").setAttribute("d", line);
    figure.querySelector("path.area").setAttribute("d", area);
    const top = figure.querySelector("[data-ytop]");
    top.textContent = key === "memory_used_mib" ? fmtMiB(yMax) : String(Math.round(yMax));
    const nodata = /** @type {HTMLElement | null} */ (figure.querySelector(".nodata"));
    if (nodata) nodata.style.display = values.length ? "none" : "";
    const last = [...points].reverse().find((p) => p[key] !== null && p[key] !== undefined);
    figure.querySelector("[data-now]").textContent = formatValue(
      key,
      latest ? latest[key] : last ? last[key] : null,
    );
  }
}

// ---- latest values ----------------------------------------------------------------------------

function tile(key, v) {
  const node = /** @type {HTMLElement | null} */ (document.querySelector(`[data-stat="${key}"]`));
  if (!node) return;
  const missing = v === null || v === undefined;
  node.classList.toggle("na", missing);
  node.title = missing ? "Not available: NVML reports no value" : "";
  if (missing) {
    node.textContent = "Not available";
    return;
  }
  const unit = { utilization_percent: "%", temperature_c: "°C", power_w: "W" }[key];
  if (key === "memory_used_mib")
    node.innerHTML = `${fmtMiB(v)} <small>of ${fmtMiB(latest.memory_total_mib ?? memTotal)}</small>`;
  else node.innerHTML = `${Math.round(v)}<small>${unit}</small>`;
}

function paint(t) {
  for (const key of ["utilization_percent", "memory_used_mib", "temperature_c", "power_w"])
    tile(key, t[key]);
  const card = document.getElementById(`gpu-${gpuId}`);
  if (card) {
    card.dataset.heat = heatBucket(t.utilization_percent);
    const util = card.querySelector('[data-live="util"]');
    if (util) util.textContent = fmtPct(t.utilization_percent);
    const mem = card.querySelector('[data-live="mem"]');
    if (mem) mem.textContent = fmtMiBPair(t.memory_used_mib, t.memory_total_mib ?? memTotal);
    const temp = card.querySelector('[data-live="temp"]');
    if (temp) temp.textContent = fmtNum(t.temperature_c, "°C");
    const power = card.querySelector('[data-live="power"]');
    if (power) power.textContent = fmtNum(t.power_w, " W");
  }
  for (const [pid, v] of Object.entries(t.partitions || {})) {
    const slice =
      card &&
      /** @type {HTMLElement | null} */ (card.querySelector(`.slice[data-partition="${pid}"]`));
    if (slice) {
      slice.dataset.heat = heatBucket(v.utilization_percent);
      const text = slice.querySelector('[data-live="pu"]');
      if (text)
        text.textContent = v.utilization_percent == null ? "n/a" : fmtPct(v.utilization_percent);
    }
    const row = document.querySelector(`#partitions tr[data-partition="${pid}"]`);
    if (!row) continue;
    const pu = /** @type {HTMLElement} */ (row.querySelector('[data-live="pu"]'));
    pu.dataset.heat = heatBucket(v.utilization_percent);
    pu.textContent = v.utilization_percent == null ? "n/a" : fmtPct(v.utilization_percent);
    pu.title = v.utilization_percent == null ? NA : "";
    row.querySelector('[data-live="pm"]').textContent =
      v.memory_used_mib == null ? "n/a" : fmtMiB(v.memory_used_mib);
  }
  const seen = document.querySelector('[data-live="seen"]');
  if (seen) seen.textContent = "just now";
}

// ---- re-render the server parts after a change -------------------------------------------------

const refreshPanel = debounce(async () => {
  const { ok } = await refreshParts(`/ui/gpus/${gpuId}/panel`, ["#gpu-panel", "#gpu-body"]);
  if (ok && latest) paint(latest);
}, 250);

live.on("hello", () => live.subscribe([gpuId]));
live.on("frame", (frame) => {
  const t = (frame.telemetry || {})[gpuId];
  if (t) {
    latest = t;
    points.push({
      t: frame.ts,
      utilization_percent: t.utilization_percent,
      memory_used_mib: t.memory_used_mib,
      temperature_c: t.temperature_c,
      power_w: t.power_w,
    });
    paint(t);
    if (WINDOW_S <= HISTORY_S) drawCharts(frame.ts);
  }
  const c = frame.changed || {};
  if ((c.gpu || []).includes(gpuId) || c.partition || c.allocation || c.event || c.operation)
    refreshPanel();
});
live.on("resync", async () => {
  refreshPanel();
  const result = await api("GET", `/ui/gpus/${gpuId}/history`);
  if (result.ok) {
    points.splice(0, points.length, ...result.data.points);
    drawCharts(Date.now() / 1000);
  }
});

// ---- actions ----------------------------------------------------------------------------------

page.addEventListener("click", async (e) => {
  const button = /** @type {HTMLButtonElement | null} */ (
    /** @type {Element} */ (e.target).closest("button[data-action]")
  );
  if (!button) return;
  const action = button.dataset.action;
  let body;
  if (action === "cordon") {
    const reason = prompt("Cordon: no new work lands on this GPU. Reason (optional):", "");
    if (reason === null) return;
    body = { reason };
  }
  button.disabled = true;
  const result = await api("POST", `/api/v1/gpus/${gpuId}/${action}`, body);
  button.disabled = false;
  const label = { cordon: "cordon", uncordon: "uncordon", heal: "return the GPU to service" }[
    action
  ];
  if (!result.ok) {
    toastError(result, `Cannot ${label}`);
    return;
  }
  const done = {
    cordon: "GPU cordoned",
    uncordon: "GPU uncordoned",
    heal: "GPU returned to service",
  }[action];
  toast(done, { kind: "ok", lines: [result.data.summary] });
  refreshPanel();
});

function rangeLabel(seconds) {
  if (seconds >= 604800) return "last 7 days";
  if (seconds >= 86400) return "last 24 hours";
  return seconds >= 3600 ? "last hour" : `last ${seconds / 60} min`;
}
function minutes(seconds) {
  if (seconds >= 86400) return `−${seconds / 86400} d`;
  if (seconds > 3600) return `−${seconds / 3600} h`;
  return seconds < 120 ? `−${seconds} s` : `−${seconds / 60} min`;
}
async function loadLong(window) {
  const result = await api("GET", `/api/v1/gpus/${gpuId}/history?window=${window}`);
  if (!result.ok) {
    toastError(result, "Cannot load the history");
    return false;
  }
  longPoints = result.data.points;
  const minutesEach = Math.round(result.data.bucket_s / 60);
  document.getElementById("range-note").textContent =
    `means of ${minutesEach} min each; gaps where NVML had no value`;
  return true;
}
document.getElementById("range").addEventListener("change", async (e) => {
  const range = /** @type {HTMLInputElement} */ (e.target); // the radio button picked
  const seconds = Number(range.value);
  if (range.dataset.window && !(await loadLong(range.dataset.window))) return;
  if (!range.dataset.window) document.getElementById("range-note").textContent = LIVE_NOTE;
  WINDOW_S = seconds;
  for (const node of document.querySelectorAll("[data-range-label]"))
    node.textContent = rangeLabel(WINDOW_S);
  for (const node of document.querySelectorAll("[data-axis-start]"))
    node.textContent = minutes(WINDOW_S);
  for (const node of document.querySelectorAll("[data-axis-mid]"))
    node.textContent = minutes(WINDOW_S / 2);
  drawCharts(Date.now() / 1000);
});

drawCharts(history.now);
live.start();
