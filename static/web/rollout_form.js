// @ts-check
// The Rollouts page's New rollout form (operators): a selector (product, host labels) and one
// layout (mode, MIG slices as profile@start), sent as the REST API's body. Dry run shows what it
// would do; Start asks first (the one confirm dialog). The JSON it sends is shown under it.
import { api, el, toast } from "./core.js";
import { confirmAction } from "./confirm.js";

const form = /** @type {HTMLFormElement | null} */ (document.getElementById("rollout-new"));

/** The body the API takes, from the form. @param {HTMLFormElement} f */
function body(f) {
  const data = new FormData(f);
  const text = (/** @type {string} */ name) => String(data.get(name) || "").trim();
  /** @type {Record<string, string>} */
  const labels = {};
  for (const pair of text("labels").split(",")) {
    const [key, ...value] = pair.split("=");
    if (key.trim()) labels[key.trim()] = value.join("=").trim();
  }
  const mode = text("mode") || "mig";
  /** @type {any} */
  const layout = { mode };
  if (mode === "mig") {
    layout.instances = text("instances")
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean)
      .map((s) => {
        const [profile, start] = s.split("@");
        return { profile: profile.trim(), start: Number(start) };
      });
  }
  /** @type {any} */
  const selector = {};
  if (text("product")) selector.product = text("product");
  if (Object.keys(labels).length) selector.labels = labels;
  return {
    selector,
    layout,
    max_unavailable: Number(text("max_unavailable")) || 1,
    timeout_s: Number(text("timeout_s")) || 600,
  };
}

if (form) {
  const f = form;
  const error = /** @type {HTMLElement} */ (document.getElementById("ro-error"));
  const plan = /** @type {HTMLElement} */ (document.getElementById("ro-plan"));
  const json = /** @type {HTMLElement} */ (document.getElementById("ro-json"));
  const show = () => (json.textContent = JSON.stringify(body(f), null, 2));
  f.addEventListener("input", show);
  show();

  /** @param {boolean} dryRun */
  async function send(dryRun) {
    error.hidden = true;
    const result = await api("POST", "/api/v1/rollouts/", { ...body(f), dry_run: dryRun });
    if (!result.ok) {
      error.textContent =
        (result.data && result.data.message) || `The request failed (${result.status}).`;
      error.hidden = false;
      return null;
    }
    return result.data;
  }

  /** @param {any} d */
  function describe(d) {
    const gpus = d.gpus.length;
    return (
      `${gpus} GPU${gpus === 1 ? "" : "s"} reshaped; ` +
      `${d.replicas_to_move} replica${d.replicas_to_move === 1 ? " moves" : "s move"}` +
      (d.replicas_without_room ? `, ${d.replicas_without_room} with no room elsewhere` : "")
    );
  }

  /** @returns {Promise<any>} */
  async function dryRun() {
    plan.replaceChildren();
    const d = await send(true);
    if (!d) return null;
    plan.replaceChildren(
      el("p", { text: `Dry run: ${describe(d)}.` }),
      d.problems.length
        ? el(
            "ul",
            { class: "form-error" },
            ...d.problems.slice(0, 10).map((p) => el("li", { text: String(p) })),
          )
        : null,
    );
    return d;
  }

  /** @type {HTMLButtonElement} */ (document.getElementById("ro-dry")).addEventListener(
    "click",
    dryRun,
  );
  f.addEventListener("submit", async (event) => {
    event.preventDefault();
    const d = await dryRun();
    if (!d) return;
    const sure = await confirmAction({
      title: "Start this rollout?",
      impact: `${describe(d)}. Each GPU is drained, reshaped and put back, ${body(f).max_unavailable} at a time.`,
      action: "Start rollout",
    });
    if (!sure) return;
    const started = await send(false);
    if (started)
      toast(`Rollout ${started.id} started`, { kind: "ok", lines: [started.summary || ""] });
  });
}
