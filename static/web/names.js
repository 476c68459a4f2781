// @ts-check
// GPUs by their names (`a100-b01/gpu0`, never "GPU 33") and refusal reasons in sentences, for
// every script that holds only ids and the engine's violations: the fit preview, the Place and
// Move dialogs, the toasts. The sentences come from the server (fleet/web/reasons.py, in the page
// config), so the tray and the scripts word a refusal alike.

/** The server's sentences (the page config's `reasons`; core.js reads the same object). */
const reasons =
  JSON.parse(document.getElementById("page-config")?.textContent || "{}").reasons || {};

/** @type {Map<number, string>} GPU id -> its name, as the server gave it */
const known = new Map();

/** @typedef {{code?: string, message?: string, details?: Object<string, any>}} Violation */

/**
 * A GPU's name: from its card on the page, else as the server gave it; `null` when unknown.
 * @param {number} id
 * @returns {string | null}
 */
export function gpuName(id) {
  const card = /** @type {HTMLElement | null} */ (document.getElementById(`gpu-${id}`));
  return card?.dataset.label || known.get(id) || null;
}

/**
 * Asks the server for the names of the GPUs not known yet (500 at a time).
 * @param {Iterable<number>} ids
 */
export async function learnGpuNames(ids) {
  const missing = [...new Set(ids)].filter((id) => Number.isInteger(id) && gpuName(id) == null);
  for (let i = 0; i < missing.length; i += 500) {
    const chunk = missing.slice(i, i + 500);
    try {
      const response = await fetch(`/ui/gpu-names?id=${chunk.join(",")}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (!response.ok) return;
      const body = await response.json();
      for (const [id, name] of Object.entries(body.names || {})) known.set(Number(id), name);
    } catch {
      return; // unnamed GPUs keep a neutral wording
    }
  }
}

/** The ids of the GPUs a message names ("GPU 33"). @param {string} text */
export function gpuIdsIn(text) {
  return [...String(text || "").matchAll(/\bGPU (\d+)\b/g)].map((m) => Number(m[1]));
}

/** The message with each "GPU 33" named, where its name is known. @param {string} text */
export function namedGpus(text) {
  return String(text || "").replace(/\bGPU (\d+)\b/g, (whole, id) => gpuName(Number(id)) || whole);
}

/**
 * A violation in a sentence (the server's template for its code), said of one GPU or of `gpus`
 * GPUs; a code without a template keeps the engine's words, GPUs named.
 * @param {Violation} violation
 * @param {number} [gpus]
 */
export function reasonText(violation, gpus = 1) {
  const template = (reasons.sentences || {})[violation.code || ""];
  if (template) {
    const subject = gpus > 1 ? `each of ${gpus} GPUs` : "this GPU";
    const details = violation.details || {};
    /** @type {Object<string, any>} */
    const values = {
      ...details,
      this: subject,
      This: subject[0].toUpperCase() + subject.slice(1),
      mode_words: (reasons.mode_words || {})[details.mode] || "",
      wanted_words: (reasons.wanted_words || {})[details.wanted] || "",
    };
    let complete = true;
    const sentence = template.replace(/\{(\w+)\}/g, (/** @type {string} */ _, key) => {
      const value = values[key];
      if (value === undefined || value === null || value === "") complete = false;
      return String(value ?? "");
    });
    if (complete) return sentence;
  }
  return namedGpus(violation.message || "");
}
