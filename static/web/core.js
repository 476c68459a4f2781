// @ts-check
// Shared by every page: the page config, the REST client, toasts, formatting, fragment swaps,
// following an operation, and the live socket. Plain ES modules, no build step.
import { namedGpus, reasonText } from "./names.js";

/**
 * The page config (fleet/web/views.page_context, rendered as the `page-config` json_script): the
 * server's vocabulary (operation statuses, socket close codes, filters, limits) so no script
 * keeps a copy of it.
 * @type {{role: string, can_operate: boolean, can_deploy?: boolean, final_statuses: string[],
 *   close_codes: {signed_out: number, no_role: number}, na_title: string,
 *   gpu_filters?: object[], mps_limits?: Object<string, {min: number, max: number}>,
 *   drain_steps?: Object<string, string>}}
 */
export const config = Object.freeze(
  JSON.parse(document.getElementById("page-config")?.textContent || "{}"),
);

export const canOperate = config.can_operate === true;
/** Acts on some team's deployments (a fleet operator: on every team's). */
export const canDeploy = config.can_deploy === true || canOperate;

/** Whether an operation with this status is over (the server's FINAL_STATUSES). */
export function isFinal(status) {
  return (config.final_statuses || []).includes(status);
}

function cookie(name) {
  const hit = document.cookie.split("; ").find((c) => c.startsWith(name + "="));
  return hit ? decodeURIComponent(hit.slice(name.length + 1)) : "";
}

/** Calls the REST API (the same one automation uses). Resolves to {ok, status, data}. */
export async function api(method, url, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    headers["X-CSRFToken"] = cookie("csrftoken");
  }
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    return {
      ok: false,
      status: 0,
      data: { code: "network", message: "The server cannot be reached.", details: {} },
    };
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { code: "bad_response", message: text.slice(0, 200), details: {} };
    }
  }
  return { ok: response.ok, status: response.status, data };
}

/** The violations of an error envelope (`details.violations`), else []. */
export function violations(data) {
  const list = data && data.details && data.details.violations;
  return Array.isArray(list) ? list : [];
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null && value !== false)
      node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}
export { el };

/** A toast: kind is "info", "ok", "warn" or "error"; lines become a list. */
export function toast(title, { kind = "info", lines = [], timeout = 6000 } = {}) {
  const box = document.getElementById("toasts");
  if (!box) return null;
  const node = el(
    "div",
    { class: `toast ${kind}`, role: kind === "error" ? "alert" : "status" },
    el("strong", { text: title }),
    lines.length
      ? el(
          "ul",
          {},
          lines.map((line) => el("li", {}, line)),
        )
      : null,
  );
  box.append(node);
  while (box.children.length > 4) box.firstElementChild.remove();
  if (timeout) setTimeout(() => node.remove(), timeout);
  return node;
}

/** Shows an API refusal: the message, then every violation's message with its code. */
export function toastError(result, title) {
  const data = result.data || {};
  const lines = violations(data).map((v) =>
    el("span", {}, reasonText(v) + " ", el("code", { text: v.code })),
  );
  if (result.status === 403) {
    toast(title || "Not allowed", {
      kind: "error",
      lines: [data.message || "Your role does not allow this action.", ...lines],
      timeout: 9000,
    });
    return;
  }
  const first = violations(data)[0];
  const message = first && first.message === data.message ? reasonText(first) : data.message;
  toast(
    title
      ? `${title}: ${namedGpus(message) || "refused"}`
      : namedGpus(message) || `Request failed (${result.status})`,
    { kind: "error", lines, timeout: 10000 },
  );
}

// ---- formatting (the same rules as fleet/web/templatetags) -------------------------------------

export function heatBucket(u) {
  return u === null || u === undefined
    ? "na"
    : String(Math.max(0, Math.min(10, Math.round(u / 10))));
}
export function fmtPct(v) {
  return v === null || v === undefined ? "n/a" : `${Math.round(v)}%`;
}
export function fmtNum(v, unit) {
  return v === null || v === undefined ? "n/a" : `${Math.round(v)}${unit}`;
}
export function fmtMiB(v) {
  if (v === null || v === undefined) return "n/a";
  const gib = v / 1024;
  if (gib >= 100) return `${Math.round(gib)} GiB`;
  if (gib >= 1) return `${gib.toFixed(1).replace(/\.0$/, "")} GiB`;
  return `${Math.round(v)} MiB`;
}
/** `17.2/79.6 GiB` (the same as presenters.format_mib_pair). */
export function fmtMiBPair(used, total) {
  if (used === null || used === undefined) return `n/a of ${fmtMiB(total)}`;
  if (total >= 1024) {
    return `${(used / 1024).toFixed(1)}/${(total / 1024).toFixed(1)} GiB`
      .replace(".0/", "/")
      .replace(".0 GiB", " GiB");
  }
  return `${Math.round(used)}/${Math.round(total)} MiB`;
}
export function naTitle() {
  return config.na_title || "Not available";
}

// ---- fragments ---------------------------------------------------------------------------------

/** Fetches server-rendered HTML and returns its top-level elements. */
export async function fragment(url) {
  const response = await fetch(url, {
    credentials: "same-origin",
    headers: { Accept: "text/html" },
  });
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  const template = document.createElement("template");
  template.innerHTML = await response.text();
  return template.content;
}

/** Replaces `old` by `fresh` unless their data-sig match (so unchanged nodes keep their state). */
export function swap(old, fresh) {
  if (!old || !fresh) return false;
  if (old.dataset.sig && old.dataset.sig === fresh.dataset.sig) return false;
  old.replaceWith(fresh);
  return true;
}

/**
 * Re-renders parts of the page from the server: fetches `url` and, for each selector, copies the
 * fresh part's content into the page's where it differs (the part itself stays, with its
 * listeners). Resolves as api() does, to whether the answer was a success and its status (0 when
 * the server could not be reached).
 * @param {string} url
 * @param {string[]} selectors each names one part, in the page and in the answer
 * @returns {Promise<{ok: boolean, status: number}>}
 */
export async function refreshParts(url, selectors) {
  let response;
  try {
    response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  } catch {
    return { ok: false, status: 0 };
  }
  if (!response.ok) return { ok: false, status: response.status };
  const template = document.createElement("template");
  template.innerHTML = await response.text();
  for (const selector of selectors) {
    const fresh = template.content.querySelector(selector);
    const old = document.querySelector(selector);
    if (fresh && old && fresh.innerHTML !== old.innerHTML) old.innerHTML = fresh.innerHTML;
  }
  return { ok: true, status: response.status };
}

/**
 * Re-renders a table's rows from the server: fetches `url` and makes its `rowSelector` rows the
 * children of `body`. A row whose data-sig is unchanged stays as it is (with its state), and the
 * body is left alone when no row changed. `empty`, if given, shows when no row is left.
 * @param {string} url
 * @param {HTMLElement} body
 * @param {string} rowSelector
 * @param {{empty?: HTMLElement | null}} [options]
 * @returns {Promise<boolean>} whether the rows were read
 */
export async function refreshRows(url, body, rowSelector, { empty = null } = {}) {
  let content;
  try {
    content = await fragment(url);
  } catch {
    return false;
  }
  const rows = [
    .../** @type {NodeListOf<HTMLElement>} */ (content.querySelectorAll(rowSelector)),
  ].map((row) => {
    const old = row.id ? document.getElementById(row.id) : null;
    return old && row.dataset.sig && old.dataset.sig === row.dataset.sig ? old : row;
  });
  const same =
    rows.length === body.children.length && rows.every((row, i) => body.children[i] === row);
  if (!same) body.replaceChildren(...rows);
  if (empty) empty.hidden = rows.length > 0;
  return true;
}

/** Runs fn at most once per `ms`, with the latest arguments merged by the caller. */
export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// ---- the live socket ---------------------------------------------------------------------------

/**
 * One WebSocket per tab to ws/fleet/. Emits "frame" (telemetry + changed ids) and "resync" (after
 * a reconnect: the page re-reads what it shows). Reconnects with capped exponential backoff.
 */
class Live extends EventTarget {
  constructor() {
    super();
    this.attempt = 0;
    this.connected = false;
    this.everConnected = false;
    this.subscription = null;
    this.lastSeq = 0;
    this.status = document.getElementById("live-status");
  }

  start() {
    if (this.socket) return this;
    this.open();
    window.addEventListener("online", () => this.retryNow());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) this.retryNow();
    });
    return this;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    return `${scheme}://${location.host}/ws/fleet/`;
  }

  open() {
    this.setState(this.everConnected ? "reconnecting" : "connecting");
    const socket = new WebSocket(this.url());
    this.socket = socket;
    socket.addEventListener("message", (event) => this.receive(JSON.parse(event.data)));
    socket.addEventListener("close", (event) => this.closed(event));
  }

  receive(message) {
    if (message.type === "hello") {
      const again = this.everConnected;
      this.connected = this.everConnected = true;
      this.attempt = 0;
      this.lastSeq = 0;
      this.setState("live");
      if (this.subscription !== null) this.send({ type: "subscribe", gpus: this.subscription });
      this.dispatchEvent(new CustomEvent("hello", { detail: message }));
      if (again) this.dispatchEvent(new CustomEvent("resync", { detail: message }));
    } else if (message.type === "frame") {
      // A gap in seq means nothing here (frames are hints), but it is worth a re-sync.
      const gap = this.lastSeq && message.seq !== this.lastSeq + 1;
      this.lastSeq = message.seq;
      this.dispatchEvent(new CustomEvent("frame", { detail: message }));
      if (gap) this.dispatchEvent(new CustomEvent("resync", { detail: message }));
    }
  }

  closed(event) {
    this.connected = false;
    this.socket = null;
    const codes = config.close_codes;
    if (event.code === codes.signed_out || event.code === codes.no_role) {
      const signedOut = event.code === codes.signed_out;
      this.setState("closed", signedOut ? "Signed out" : "Not allowed");
      if (signedOut)
        toast("Your session has ended", {
          kind: "warn",
          lines: ["Sign in again to keep receiving live updates."],
          timeout: 0,
        });
      return;
    }
    const delay = Math.min(10000, 500 * 2 ** this.attempt) * (0.75 + Math.random() * 0.5);
    this.attempt += 1;
    this.setState("reconnecting");
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.open(), delay);
  }

  retryNow() {
    if (this.socket || this.connected) return;
    clearTimeout(this.timer);
    this.open();
  }

  send(message) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN)
      this.socket.send(JSON.stringify(message));
  }

  /** Narrows telemetry to these GPU ids (null: every GPU). Survives reconnects. */
  subscribe(gpuIds) {
    this.subscription = gpuIds === null ? null : [...gpuIds];
    this.send({ type: "subscribe", gpus: this.subscription });
  }

  setState(state, label) {
    if (!this.status) return;
    this.status.dataset.state = state;
    const text = {
      live: "Live",
      connecting: "Connecting…",
      reconnecting: "Reconnecting…",
      closed: label || "Offline",
    }[state];
    this.status.querySelector(".txt").textContent = text;
  }

  /** @param {string} type @param {(detail: any) => void} handler */
  on(type, handler) {
    this.addEventListener(type, (event) => handler(/** @type {CustomEvent} */ (event).detail));
    return this;
  }
}

export const live = new Live();
/** @type {any} */ (window).fleetLive = live; // for the browser tests and for debugging from the console

/**
 * Keeps a page that shows no telemetry up to date, and starts the socket: `refresh` runs when a
 * frame's changes concern the page and after a re-sync.
 * @param {(changed: Object<string, number[]>) => unknown} concerns given a frame's `changed`
 * @param {() => void} refresh
 */
export function refreshOnChanges(concerns, refresh) {
  live.on("frame", (frame) => {
    if (concerns(frame.changed || {})) refresh();
  });
  live.on("resync", () => refresh());
  live.on("hello", () => live.subscribe([])); // no telemetry needed
  live.start();
}

// ---- operations: follow one until it is over ------------------------------------------------

const POLL_MS = 3000; // a fallback: `changed` frames are hints and can be lost
const followed = new Map(); // operation id -> {last, onChange, timer, busy, again, stop}

async function refreshOperation(id) {
  const entry = followed.get(id);
  if (!entry) return;
  if (entry.busy) {
    entry.again = true;
    return;
  } // re-read once the answer in flight is in
  entry.busy = true;
  clearTimeout(entry.timer);
  const result = await api("GET", `/api/v1/operations/${id}/`);
  entry.busy = false;
  if (followed.get(id) !== entry) return; // stopped meanwhile
  const fresh = result.ok ? result.data : null;
  if (fresh && isFinal(fresh.status)) followed.delete(id);
  else if (entry.again) setTimeout(() => refreshOperation(id), 0);
  else entry.timer = setTimeout(() => refreshOperation(id), POLL_MS);
  entry.again = false;
  const moved =
    fresh &&
    (fresh.status !== entry.last.status ||
      JSON.stringify(fresh.payload) !== JSON.stringify(entry.last.payload));
  if (moved) {
    entry.last = fresh;
    entry.onChange(fresh);
  }
}

/**
 * Follows `operation` (as the API returned it) until its status is final: `onChange(operation)`
 * runs each time its status or payload moves, the last time with the final status. Re-reads it
 * when a frame names it, after a re-sync, and every few seconds in case a frame was lost.
 * Returns a function that stops following.
 * @param {{id: number, status: string, payload?: object}} operation
 * @param {(operation: object) => void} onChange
 * @returns {() => void}
 */
export function followOperation(operation, onChange) {
  followed.get(operation.id)?.stop(); // one follower per operation: the latest
  if (isFinal(operation.status)) return () => {};
  const entry = { last: operation, onChange, timer: 0, busy: false, again: false, stop: () => {} };
  entry.stop = () => {
    clearTimeout(entry.timer);
    if (followed.get(operation.id) === entry) followed.delete(operation.id);
  };
  followed.set(operation.id, entry);
  entry.timer = setTimeout(() => refreshOperation(operation.id), POLL_MS);
  return entry.stop;
}

/**
 * Follows `operation` (followOperation) and toasts how it ended: `succeeded` as the title when it
 * succeeds, else "`failed` <status>" ("Moving web[0] failed"), with the operation's reason (or
 * `noReason`) as the line. `onProgress` runs at each move before the end, `onEnd` at the end,
 * before the toast.
 * @param {{id: number, status: string, payload?: object}} operation as the API returned it
 * @param {object} how
 * @param {string} how.succeeded the title when it succeeds
 * @param {string} how.failed the title when it fails or expires, before the status
 * @param {string} [how.noReason] the line of a failure that gives no reason
 * @param {number} [how.timeout] how long a success shows, in ms (a failure: 10 s)
 * @param {(operation: any) => void} [how.onProgress]
 * @param {(operation: any) => void} [how.onEnd]
 * @returns {() => void} stops following
 */
export function followWithToasts(
  operation,
  { succeeded, failed, noReason = "", timeout = 10000, onProgress, onEnd },
) {
  return followOperation(operation, (/** @type {any} */ latest) => {
    if (!isFinal(latest.status)) {
      onProgress?.(latest);
      return;
    }
    onEnd?.(latest);
    if (latest.status === "succeeded") {
      toast(succeeded, {
        kind: "ok",
        lines: latest.reason ? [namedGpus(latest.reason)] : [],
        timeout,
      });
    } else {
      const reason = namedGpus(latest.reason) || noReason;
      toast(`${failed} ${latest.status}`, {
        kind: "error",
        lines: reason ? [reason] : [],
        timeout: 10000,
      });
    }
  });
}

live.on("frame", (frame) => {
  for (const id of (frame.changed || {}).operation || [])
    if (followed.has(id)) refreshOperation(id);
});
live.on("resync", () => {
  for (const id of followed.keys()) refreshOperation(id);
});
