// @ts-check
// The deployment page's log viewer: a replica's lines, each with the time its agent captured it,
// asked of the agent of its host (GET /api/v1/allocations/<id>/logs). It follows by default
// (polls the newest lines and stays at the bottom until the user scrolls up), loads older lines
// on demand (the agent keeps a bounded ring and says when older ones are gone), filters and
// highlights the loaded lines, wraps or not, and downloads what is loaded as a .txt file.
import { api } from "./core.js";

const LOG_LINES = 200;
const FOLLOW_EVERY_MS = 2000;
const MAX_LOADED = 20000;

/** @typedef {{ seq: number | null, ts: string | null, line: string }} Entry */

/** @param {string} id */
const el = (id) => document.getElementById(id);

/** "15:40:42.123" in the viewer's time zone; the full ISO time goes in the title.
 * @param {string} iso */
function clock(iso) {
  const t = new Date(iso);
  const pad = (/** @type {number} */ n, w = 2) => String(n).padStart(w, "0");
  return `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}.${pad(t.getMilliseconds(), 3)}`;
}

/** Wire the panel; returns `sync`, to call after the replica table is re-rendered. */
export function wireLogs() {
  const panel = /** @type {HTMLDetailsElement | null} */ (el("dep-logs"));
  const replica = /** @type {HTMLSelectElement | null} */ (el("logs-replica"));
  const output = el("logs-output");
  const errorBox = el("logs-error");
  const status = el("logs-status");
  const follow = /** @type {HTMLInputElement | null} */ (el("logs-follow"));
  const wrap = /** @type {HTMLInputElement | null} */ (el("logs-wrap"));
  const search = /** @type {HTMLInputElement | null} */ (el("logs-search"));
  const matches = el("logs-matches");
  const older = /** @type {HTMLButtonElement | null} */ (el("logs-older"));
  const olderNote = el("logs-older-note");
  if (!panel || !replica || !output || !status) return { sync() {} };

  /** @type {Entry[]} */
  let entries = [];
  let pageable = false; // the answers carry cursors
  let moreOlder = false; // older lines exist (truncated at the top)
  let olderGone = false; // older lines existed and the agent no longer keeps them
  /** @type {number | undefined} */
  let timer;
  let busy = false;
  let readAt = "";
  let autoTop = -1; // where the viewer last scrolled itself: a scroll event from there is its own

  function toBottom() {
    if (!output) return;
    output.scrollTop = output.scrollHeight;
    autoTop = output.scrollTop;
  }

  /** @param {string} message */
  function showError(message) {
    if (!errorBox) return;
    errorBox.textContent = message;
    errorBox.hidden = !message;
  }

  const atBottom = () => output.scrollTop + output.clientHeight >= output.scrollHeight - 4;

  /** One line: its time (or a blank of the same width), then its text with the matches marked.
   * @param {Entry} entry @param {string} needle */
  function lineNode(entry, needle) {
    const row = document.createElement("span");
    row.className = "log-line";
    const time = document.createElement("time");
    time.className = "log-time";
    if (entry.ts) {
      time.dateTime = entry.ts;
      time.title = entry.ts;
      time.textContent = clock(entry.ts);
    } else {
      time.title = "Not known: the agent found this line already written";
      time.textContent = "—".padEnd(12, " ");
    }
    row.append(time, " ");
    const text = entry.line;
    if (needle) {
      const folded = text.toLowerCase();
      let from = 0;
      for (let at = folded.indexOf(needle); at >= 0; at = folded.indexOf(needle, from)) {
        row.append(text.slice(from, at));
        const mark = document.createElement("mark");
        mark.textContent = text.slice(at, at + needle.length);
        row.append(mark);
        from = at + needle.length;
      }
      row.append(text.slice(from));
    } else row.append(text);
    row.append("\n");
    return row;
  }

  /** Re-render the loaded lines (filtered by the search) and the status around them. */
  function render({ keepBottom = false, keepTop = false } = {}) {
    if (!output || !status) return;
    const needle = (search?.value || "").toLowerCase();
    const shown = needle ? entries.filter((e) => e.line.toLowerCase().includes(needle)) : entries;
    const fromBottom = output.scrollHeight - output.scrollTop;
    output.replaceChildren(...shown.map((e) => lineNode(e, needle)));
    if (keepBottom) toBottom();
    else if (keepTop) output.scrollTop = output.scrollHeight - fromBottom;
    if (matches)
      matches.textContent = needle
        ? `${shown.length} of ${entries.length} loaded line${entries.length === 1 ? "" : "s"} match`
        : "";
    const count = `${entries.length} line${entries.length === 1 ? "" : "s"} loaded`;
    status.textContent = readAt ? `${count}, read ${readAt}` : count;
    if (older) older.hidden = !(pageable && moreOlder && !olderGone && entries.length > 0);
    if (olderNote) {
      olderNote.hidden = !(olderGone || (moreOlder && !pageable && entries.length > 0));
      olderNote.textContent = olderGone
        ? "Older lines are gone: the agent keeps the newest 20,000 lines (2 MiB) of a replica."
        : "Older lines exist; this replica's output cannot be paged (a container's, or an older agent's).";
    }
  }

  /** @param {any} data @returns {Entry[]} */
  function entriesOf(data) {
    const cursors = /** @type {number[] | null} */ (data.cursors);
    const times = /** @type {(string | null)[]} */ (data.timestamps || []);
    return data.lines.map((/** @type {string} */ line, /** @type {number} */ i) => ({
      seq: cursors ? cursors[i] : null,
      ts: times[i] || null,
      line,
    }));
  }

  /** The newest lines: appended after the last loaded one (by cursor), else all replaced. */
  async function fetchNewest() {
    if (busy || !replica || !output || !status) return;
    const id = replica.value;
    if (!id) {
      entries = [];
      output.textContent = "";
      status.textContent = "No replica is placed: nothing runs yet.";
      return;
    }
    busy = true;
    output.setAttribute("aria-busy", "true");
    const result = await api("GET", `/api/v1/allocations/${id}/logs?tail=${LOG_LINES}`);
    busy = false;
    output.removeAttribute("aria-busy");
    if (replica.value !== id) return; // another replica was chosen meanwhile
    if (!result.ok) {
      showError((result.data && result.data.message) || `The request failed (${result.status}).`);
      return;
    }
    showError(result.data.error || "");
    const fresh = entriesOf(result.data);
    const stick = (follow?.checked ?? false) || atBottom();
    const last = entries.length ? entries[entries.length - 1].seq : null;
    pageable = result.data.cursors !== null;
    const newest = fresh.length ? fresh[fresh.length - 1].seq : null;
    // Appended when the answer joins on (no gap) and the cursors went on (an agent that
    // restarted numbers its lines from 1 again: then everything is replaced).
    if (
      pageable &&
      last !== null &&
      fresh.length &&
      fresh[0].seq !== null &&
      newest !== null &&
      fresh[0].seq <= last + 1 &&
      newest >= last
    ) {
      entries.push(...fresh.filter((e) => e.seq !== null && e.seq > last));
      if (entries.length > MAX_LOADED) entries = entries.slice(-MAX_LOADED);
    } else {
      entries = fresh; // the first read, a gap, or output without cursors
      moreOlder = result.data.truncated;
      olderGone = result.data.older_gone;
    }
    readAt = new Date().toLocaleTimeString();
    render({ keepBottom: stick });
  }

  async function fetchOlder() {
    if (busy || !replica || !older || !entries.length || entries[0].seq === null) return;
    const id = replica.value;
    busy = true;
    older.disabled = true;
    const result = await api(
      "GET",
      `/api/v1/allocations/${id}/logs?tail=${LOG_LINES}&before=${entries[0].seq}`,
    );
    busy = false;
    older.disabled = false;
    if (replica.value !== id) return;
    if (!result.ok) {
      showError((result.data && result.data.message) || `The request failed (${result.status}).`);
      return;
    }
    entries = [...entriesOf(result.data), ...entries].slice(0, MAX_LOADED);
    moreOlder = result.data.truncated;
    olderGone = result.data.older_gone;
    render({ keepTop: true });
  }

  /** Follow polls while the panel is open and Follow is checked, never otherwise. */
  function schedule() {
    window.clearInterval(timer);
    timer = undefined;
    if (panel?.open && follow?.checked) timer = window.setInterval(fetchNewest, FOLLOW_EVERY_MS);
  }

  function restart() {
    entries = [];
    moreOlder = olderGone = false;
    if (output) output.textContent = "";
    showError("");
    fetchNewest();
  }

  function download() {
    const text = entries.map((e) => (e.ts ? `${e.ts} ${e.line}` : e.line)).join("\n");
    const blob = new Blob([text ? `${text}\n` : ""], { type: "text/plain;charset=utf-8" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    const name = (panel?.dataset.deployment || "replica").replace(/[^\w.-]+/g, "-");
    link.download = `${name}-replica-${replica?.value || "none"}.txt`;
    document.body.append(link);
    link.click();
    link.remove();
    window.setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
  }

  panel.addEventListener("toggle", () => {
    if (panel.open) fetchNewest();
    schedule();
  });
  follow?.addEventListener("change", () => {
    if (follow.checked) {
      toBottom();
      fetchNewest();
    }
    schedule();
  });
  // Scrolling up pauses Follow (Follow, or scrolling back down and ticking it, resumes it).
  output.addEventListener("scroll", () => {
    if (follow?.checked && !atBottom() && Math.abs(output.scrollTop - autoTop) > 2) {
      follow.checked = false;
      schedule();
    }
  });
  wrap?.addEventListener("change", () => output.classList.toggle("nowrap", !wrap.checked));
  search?.addEventListener("input", () => render({ keepBottom: follow?.checked ?? false }));
  older?.addEventListener("click", fetchOlder);
  replica.addEventListener("change", restart);
  el("logs-refresh")?.addEventListener("click", () => fetchNewest());
  el("logs-download")?.addEventListener("click", download);

  /** The picker lists the placed replicas of the (re-rendered) table; the choice is kept. */
  function sync() {
    if (!replica) return;
    const rows = /** @type {NodeListOf<HTMLElement>} */ (
      document.querySelectorAll("#replicas tr[data-allocation-id]")
    );
    const wanted = [...rows].map((row) => [
      row.dataset.allocationId || "",
      row.dataset.logsLabel || "",
    ]);
    const current = [...replica.options].map((o) => [o.value, o.textContent]);
    if (JSON.stringify(wanted) === JSON.stringify(current)) return;
    const chosen = replica.value;
    replica.replaceChildren(...wanted.map(([value, label]) => new Option(label, value)));
    if (wanted.some(([value]) => value === chosen)) replica.value = chosen;
    else if (panel?.open) restart();
  }
  return { sync };
}
