// @ts-check
// The alerts page (admins): the live socket (as every page), and the New webhook form, which
// sends what the REST API takes (POST /api/v1/alerts/webhooks/) and shows its refusal in place.
import "./live_page.js";
import { api, toast, violations } from "./core.js";

const form = /** @type {HTMLFormElement | null} */ (document.getElementById("webhook-form"));
if (form) {
  const error = /** @type {HTMLElement} */ (document.getElementById("webhook-error"));
  const button = /** @type {HTMLButtonElement} */ (form.querySelector("button[type=submit]"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const body = {
      url: String(data.get("url") || "").trim(),
      secret: String(data.get("secret") || ""),
      events: data.getAll("events").map(String),
      format: String(data.get("format") || "fleet"),
      enabled: data.get("enabled") !== null,
    };
    for (const input of form.querySelectorAll("[aria-invalid]"))
      input.removeAttribute("aria-invalid");
    error.hidden = true;
    button.disabled = true;
    // The server judges every field and says why it refuses: no second set of rules here.
    const result = await api("POST", "/api/v1/alerts/webhooks/", body);
    button.disabled = false;
    if (!result.ok) {
      const fields = result.data && result.data.details && result.data.details.fields;
      const lines = fields
        ? Object.entries(fields).map(([name, why]) => `${name}: ${[why].flat().join(" ")}`)
        : violations(result.data).map((v) => String(v.message || v));
      if (!fields && lines.length) lines.unshift(String(result.data.message || ""));
      // One line a refused field (the message repeats the first), else the message.
      error.textContent = lines.length
        ? lines.join(" ")
        : (result.data && result.data.message) || `The request failed (${result.status}).`;
      error.hidden = false;
      for (const name of Object.keys(fields || {})) {
        form.querySelector(`[name="${name}"]`)?.setAttribute("aria-invalid", "true");
      }
      return;
    }
    toast(`Webhook ${result.data.id} added: ${result.data.url}`, { kind: "ok" });
    window.location.reload(); // the table is the server's: it shows the new row
  });
}
