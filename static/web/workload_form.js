// @ts-check
// The workload fields (templates/web/partials/workload_fields.html) of the New-deployment dialog
// and of a deployment's rolling update: what runs, read into the API's workload body, filled
// from one, and only the fields of the chosen runtime and health check shown.

/** The workload keys these fields set; a rolling update keeps the others as they are. */
export const WORKLOAD_FIELDS = [
  "runtime",
  "image",
  "command",
  "cwd",
  "user",
  "env",
  "restart",
  "stop_grace_s",
  "health",
];

/** Show the fields of the chosen runtime and health check. @param {HTMLFormElement} form */
export function syncWorkload(form) {
  const data = new FormData(form);
  const runtime = String(data.get("runtime") || "none");
  for (const el of /** @type {NodeListOf<HTMLElement>} */ (form.querySelectorAll("[data-runtime]")))
    el.hidden = !(el.dataset.runtime || "").split(" ").includes(runtime);
  const health = String(data.get("health") || "");
  for (const el of /** @type {NodeListOf<HTMLElement>} */ (form.querySelectorAll("[data-health]")))
    el.hidden = !health || !(el.dataset.health || "").split(" ").includes(health);
}

/** An argument list as one line that splitArgs reads back. @param {string[]} args */
function joinArgs(args) {
  return (args || [])
    .map((a) => (/^[^\s"'\\]+$/.test(a) ? a : `"${a.replace(/(["\\])/g, "\\$1")}"`))
    .join(" ");
}

/**
 * Fill the fields from a workload body (the API's), then show the right ones.
 * @param {HTMLFormElement} form @param {any} workload
 */
export function fillWorkload(form, workload) {
  /** @param {string} name @param {unknown} value */
  const set = (name, value) => {
    const field = /** @type {HTMLInputElement | null} */ (form.elements.namedItem(name));
    if (field && value !== undefined && value !== null) field.value = String(value);
  };
  const w = workload || {};
  set("runtime", w.runtime || "none");
  set("image", w.image || "");
  set("command", joinArgs(w.command));
  set("cwd", w.cwd || "");
  set("user", w.user || "");
  set(
    "env",
    Object.entries(w.env || {})
      .map(([k, v]) => `${k}=${v}`)
      .join("\n"),
  );
  set("restart", w.restart || "always");
  set("stop_grace_s", w.stop_grace_s ?? 30);
  const health = w.health || {};
  const kind = health.http ? "http" : health.tcp ? "tcp" : health.exec ? "exec" : "";
  set("health", kind);
  set("health_port", (health.http || health.tcp || {}).port ?? "");
  set("health_path", health.http ? health.http.path : "");
  set("health_command", health.exec ? joinArgs(health.exec.command) : "");
  syncWorkload(form);
}

/** Arguments as a shell would split them: spaces separate, quotes ('…' or "…") group.
 * @param {string} text @returns {string[]} */
export function splitArgs(text) {
  const args = [];
  const pattern = /"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g;
  for (const m of text.matchAll(pattern))
    args.push(m[1] !== undefined ? m[1].replace(/\\(.)/g, "$1") : (m[2] ?? m[3]));
  return args;
}

/** @param {FormData} data @returns {Object<string, unknown> | undefined} */
export function workloadBody(data) {
  const runtime = String(data.get("runtime") || "none");
  if (runtime === "none") return undefined;
  /** @type {Object<string, unknown>} */
  const workload = { runtime, command: splitArgs(String(data.get("command") || "")) };
  if (runtime === "container") workload.image = String(data.get("image") || "").trim();
  if (runtime === "process") {
    if (data.get("cwd")) workload.cwd = String(data.get("cwd")).trim();
    if (data.get("user")) workload.user = String(data.get("user")).trim();
  }
  /** @type {Object<string, string>} */
  const env = {};
  for (const line of String(data.get("env") || "").split("\n")) {
    const at = line.indexOf("=");
    if (line.trim() && at > 0) env[line.slice(0, at).trim()] = line.slice(at + 1);
    else if (line.trim()) env[line.trim()] = "";
  }
  workload.env = env;
  workload.restart = data.get("restart") || "always";
  workload.stop_grace_s = Number(data.get("stop_grace_s") || 30);
  const health = String(data.get("health") || "");
  if (health === "http")
    workload.health = {
      http: { port: Number(data.get("health_port")), path: String(data.get("health_path") || "/") },
    };
  if (health === "tcp") workload.health = { tcp: { port: Number(data.get("health_port")) } };
  if (health === "exec")
    workload.health = { exec: { command: splitArgs(String(data.get("health_command") || "")) } };
  return workload;
}
