// @ts-check
// What the fleet view's modules share: its two containers, the latest telemetry of each GPU and
// the drag in progress.

/** The host sections and their GPU cards. */
export const hostsBox = /** @type {HTMLElement} */ (document.getElementById("hosts"));
/** The deployments tray. */
export const trayBox = /** @type {HTMLElement} */ (document.getElementById("tray"));

/** @type {Map<string, Telemetry>} GPU id -> its latest telemetry (repainted onto new cards). */
export const latest = new Map();

/**
 * @typedef {{utilization_percent?: number | null, memory_used_mib?: number | null,
 *   memory_total_mib?: number | null, temperature_c?: number | null, power_w?: number | null,
 *   health?: string, partitions?: Object<string, {utilization_percent?: number | null,
 *   memory_used_mib?: number | null}>}} Telemetry
 */

/**
 * @typedef {{fit: boolean, gpuFeasible: object | null, gpuReasons: string[],
 *   partitions: Map<number, {fit: boolean, entry?: object, reasons?: string[]}>,
 *   best: any, violation?: any}} TargetInfo
 */

/**
 * The deployment being dragged (from the tray, or one placed replica of it: `allocation`), with
 * its targets once the server has ranked them.
 * @type {{current: null | {id: number, name: string, targets: Map<number, TargetInfo> | null,
 *   allocation?: number, from?: HTMLElement | null}}}
 */
export const drag = { current: null };
