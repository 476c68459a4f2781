// @ts-check
// The operations and audit feed: rows are re-rendered by the server and upserted live.
import { debounce, fragment, live, refreshRows } from "./core.js";

const body = /** @type {HTMLElement} */ (document.getElementById("ops-body"));
const form = /** @type {HTMLFormElement} */ (document.getElementById("ops-filters"));
const pending = new Set();

/** @param {HTMLElement} row */
function keep(row) {
  const status = body.dataset.status,
    kind = body.dataset.kind,
    user = body.dataset.user;
  return (
    (!status || row.dataset.status === status) &&
    (!kind || row.dataset.kind === kind) &&
    (!user || row.dataset.user === user)
  );
}

const upsert = debounce(async () => {
  const ids = [...pending];
  pending.clear();
  if (!ids.length) return;
  let content;
  try {
    content = await fragment(`/ui/operations?id=${ids.join(",")}`);
  } catch {
    return;
  }
  const rows = [
    .../** @type {NodeListOf<HTMLElement>} */ (content.querySelectorAll("tr.op-row")),
  ].sort((a, b) => Number(b.dataset.op) - Number(a.dataset.op));
  for (const row of rows.reverse()) {
    const old = document.getElementById(row.id);
    if (old) {
      if (old.dataset.sig !== row.dataset.sig) {
        old.replaceWith(row);
        row.classList.add("flash");
      }
      if (!keep(row)) row.remove();
    } else if (keep(row) && body.dataset.live === "1") {
      body.prepend(row);
      row.classList.add("flash");
      document.getElementById("ops-empty")?.remove();
    }
  }
  while (body.children.length > 300) body.lastElementChild.remove();
}, 150);

live.on("frame", (frame) => {
  for (const id of (frame.changed || {}).operation || []) pending.add(id);
  upsert();
});
/** The filters as a query string (the form has no file input: every value is a string). */
function filters() {
  return new URLSearchParams(
    /** @type {string[][]} */ (/** @type {unknown} */ (new FormData(form))),
  );
}

live.on("resync", () => refreshRows(`/operations/?${filters()}`, body, "#ops-body > tr"));
live.on("hello", () => live.subscribe([]));
form.addEventListener("change", () => form.submit());
live.start();
