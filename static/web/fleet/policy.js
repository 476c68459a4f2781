// @ts-check
// The new-deployment form's view of the chosen team's policy (GET /api/v1/teams/{id}/policy):
// what its workloads may be. Shown only; the server still refuses what the policy forbids
// (422 policy.*), and the form shows that refusal as any other.

import { api, el } from "../core.js";

/**
 * @typedef {{runtimes: string[], registries: string[], uids: number[][], allow_root: boolean,
 *   process_user: string | null, capabilities: string[], max_host_memory_mib: number,
 *   default_host_memory_mib: number, max_pids: number, host_network: boolean}} Policy
 */

/** @type {Map<string, Promise<{ok: boolean, data: any}>>} */
const cache = new Map();

/** @param {number} mib */
function memory(mib) {
  return mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`;
}

/** What the team's workloads may run as, in words. @param {Policy} policy */
function users(policy) {
  const ranges = policy.uids.length
    ? "uids " + policy.uids.map(([lo, hi]) => (lo === hi ? `${lo}` : `${lo}–${hi}`)).join(", ")
    : "any user";
  const root = policy.allow_root ? "root allowed" : "never root";
  const process =
    policy.runtimes.includes("process") && policy.process_user
      ? `; processes run as ${policy.process_user}`
      : "";
  return `${ranges} (${root})${process}`;
}

/** The rows of the policy box. @param {Policy} policy @returns {[string, string][]} */
export function policyRows(policy) {
  return [
    ["Runtimes", ["none", ...policy.runtimes].join(", ")],
    ["Registries", policy.registries.length ? policy.registries.join(", ") : "any"],
    ["Users", users(policy)],
    [
      "Host memory",
      `up to ${memory(policy.max_host_memory_mib)} a replica (default ${memory(policy.default_host_memory_mib)})`,
    ],
    ["PIDs", `up to ${policy.max_pids} a replica`],
    ["Host network", policy.host_network ? "yes" : "no (containers get no network)"],
  ];
}

/**
 * Show the policy of the team chosen in ``select`` in ``box`` (its options carry
 * ``data-team-id``); the runtimes the policy leaves out are marked in ``runtime``.
 * @param {HTMLSelectElement} select @param {HTMLElement} box @param {HTMLSelectElement} runtime
 */
export async function showPolicy(select, box, runtime) {
  const option = select.selectedOptions[0];
  const id = option?.dataset.teamId;
  if (!id) {
    box.hidden = true;
    return;
  }
  if (!cache.has(id)) cache.set(id, api("GET", `/api/v1/teams/${id}/policy`));
  const result = await /** @type {Promise<{ok: boolean, data: any}>} */ (cache.get(id));
  if (select.selectedOptions[0]?.dataset.teamId !== id) return; // another team was chosen since
  box.dataset.team = option.value;
  if (!result.ok) {
    cache.delete(id);
    box.replaceChildren(
      el("p", {
        class: "muted small",
        text: `The policy of ${option.text} cannot be read: ${result.data?.message || "no answer"}`,
      }),
    );
    box.hidden = false;
    return;
  }
  /** @type {Policy} */
  const policy = result.data;
  box.replaceChildren(
    el("p", {
      class: "small",
      text: `Policy of ${option.text}: the server refuses what it does not allow.`,
    }),
    el(
      "dl",
      { class: "kv small" },
      policyRows(policy).flatMap(([key, value]) => [
        el("dt", { text: key }),
        el("dd", { text: value, "data-policy": key.toLowerCase().replace(" ", "-") }),
      ]),
    ),
  );
  for (const choice of runtime.options) {
    const allowed = choice.value === "none" || policy.runtimes.includes(choice.value);
    choice.dataset.denied = allowed ? "" : "1";
    const label = choice.dataset.label || (choice.dataset.label = choice.text);
    choice.text = allowed ? label : `${label} (not allowed by the team's policy)`;
  }
  box.hidden = false;
}
