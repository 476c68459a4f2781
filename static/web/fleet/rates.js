// @ts-check
// Each replica's request rate in its chip's tooltip (issue 23), as the gateways measured it over
// their last 5 s: asked every 5 s while the page is visible and shows a replica chip. Only the
// replicas of deployments with an endpoint have one; the others' tooltips stay as drawn.

const URL_RATES = "/ui/replica-rates";
const EVERY_MS = 5000;
const SUFFIX = / · (measuring…|[\d.]+ req\/s)$/;

/**
 * @param {HTMLElement} chip
 * @param {number | null | undefined} rate
 */
function label(chip, rate) {
  const base = chip.title.replace(SUFFIX, "");
  if (rate === undefined) {
    if (base !== chip.title) chip.title = base;
    return;
  }
  const words = rate === null ? "measuring…" : `${rate.toFixed(1)} req/s`;
  chip.title = `${base} · ${words}`;
  chip.dataset.rps = rate === null ? "" : String(rate);
}

async function refresh() {
  const chips = /** @type {NodeListOf<HTMLElement>} */ (
    document.querySelectorAll(".rchip[data-allocation]")
  );
  if (document.hidden || chips.length === 0) return;
  try {
    const response = await fetch(URL_RATES, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) return;
    /** @type {{ rates: Record<string, number | null> }} */
    const body = await response.json();
    for (const chip of chips) label(chip, body.rates[chip.dataset.allocation || ""]);
  } catch {
    // The next round tries again; the tooltips keep what they said.
  }
}

/** Starts the rounds (once). */
export function followReplicaRates() {
  void refresh();
  setInterval(() => void refresh(), EVERY_MS);
}
