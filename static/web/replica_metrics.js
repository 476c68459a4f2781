// @ts-check
// The deployment page's replica metrics: picking a replica or a window re-fetches the panel's
// body, drawn by the server as plain SVG (the GPU page's charts); the body is re-fetched now and
// then to follow the window while the tab is visible. Without this script the form still works.

const panel = /** @type {HTMLElement | null} */ (document.getElementById("replica-metrics"));
const form = /** @type {HTMLFormElement | null} */ (document.getElementById("rm-form"));
const body = /** @type {HTMLElement | null} */ (document.getElementById("rm-body"));
// The hour moves a point every 5 s; the day and the week a point every few minutes.
const REFRESH_MS = { "1h": 15_000, "24h": 120_000, "7d": 600_000 };
let timer = 0;
let inFlight = false;

/** @returns {{ allocation: string, window: string }} */
function chosen() {
  const data = new FormData(/** @type {HTMLFormElement} */ (form));
  return {
    allocation: String(data.get("allocation") || ""),
    window: String(data.get("window") || "1h"),
  };
}

async function load() {
  if (!panel || !form || !body || inFlight) return;
  const { allocation, window } = chosen();
  const query = new URLSearchParams({ allocation, window });
  inFlight = true;
  body.setAttribute("aria-busy", "true");
  try {
    const response = await fetch(`${panel.dataset.url}?${query}`, {
      credentials: "same-origin",
      headers: { Accept: "text/html" },
    });
    if (response.ok) body.innerHTML = await response.text();
  } catch {
    // The next refresh tries again; the charts drawn last stay.
  } finally {
    inFlight = false;
    body.setAttribute("aria-busy", "false");
  }
  schedule();
}

function schedule() {
  window.clearTimeout(timer);
  const every =
    REFRESH_MS[/** @type {"1h" | "24h" | "7d"} */ (chosen().window)] || REFRESH_MS["1h"];
  timer = window.setTimeout(() => {
    if (document.visibilityState === "visible") load();
    else schedule();
  }, every);
}

if (form) {
  form.addEventListener("change", () => load());
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") load();
  });
  schedule();
}
