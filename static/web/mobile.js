// @ts-check
// Small screens (static/web/mobile.css): every data table reads as cards, each cell labelled with
// its column's header (data-label, drawn by CSS), and the fleet page's deployments tray is a
// drawer opened by a button. Rows drawn later by the live pages are labelled as they arrive.

const TABLES = "table.data, table.cap-table";
const NARROW = window.matchMedia("(max-width: 1100px)");
// Cells are labelled only while the cards show: the live pages compare a part's HTML with the
// server's before replacing it, and labels on a wide screen would make every part differ.
const CARDS = window.matchMedia("(max-width: 760px)");

/** The column headers of a table, one entry per column (a header spanning n columns repeats). */
function headers(table) {
  const row = table.tHead?.rows[table.tHead.rows.length - 1];
  if (!row) return [];
  /** @type {string[]} */
  const names = [];
  for (const cell of row.cells) {
    const name = (cell.textContent || "").replace(/\s+/g, " ").trim();
    for (let i = 0; i < cell.colSpan; i++) names.push(name);
  }
  return names;
}

/** Labels each body cell of ``table`` with its column's header (not cells spanning columns). */
function label(table) {
  const names = headers(table);
  if (!names.length) return;
  for (const body of table.tBodies) {
    for (const row of body.rows) {
      let column = 0;
      for (const cell of row.cells) {
        const name = names[column];
        if (cell.colSpan === 1 && name && cell.tagName === "TD" && cell.dataset.label !== name) {
          cell.dataset.label = name;
        }
        column += cell.colSpan;
      }
    }
  }
}

/** @type {Set<HTMLTableElement>} tables changed since the last frame */
const pending = new Set();
let scheduled = false;

function labelPending() {
  scheduled = false;
  for (const table of pending) label(table);
  pending.clear();
}

/** Labels every table's cells, or takes the labels away. @param {boolean} on */
function labelAll(on) {
  for (const table of document.querySelectorAll(TABLES)) {
    if (on) label(/** @type {HTMLTableElement} */ (table));
    else
      for (const cell of table.querySelectorAll("td[data-label]"))
        cell.removeAttribute("data-label");
  }
}

/** Labels the tables that hold or are ``node`` (a live page drew rows). @param {Node} node */
function noteChange(node) {
  if (!CARDS.matches) return;
  const element = node instanceof Element ? node : node.parentElement;
  if (!element) return;
  const table = element.closest(TABLES);
  if (table) pending.add(/** @type {HTMLTableElement} */ (table));
  else if (element.querySelector?.(TABLES)) {
    for (const t of element.querySelectorAll(TABLES)) pending.add(/** @type {any} */ (t));
  }
  if (pending.size && !scheduled) {
    scheduled = true;
    requestAnimationFrame(labelPending);
  }
}

labelAll(CARDS.matches);
CARDS.addEventListener("change", () => labelAll(CARDS.matches));
new MutationObserver((records) => {
  for (const record of records) {
    if (record.addedNodes.length) noteChange(record.target);
  }
}).observe(document.body, { childList: true, subtree: true });

/** The fleet page's tray as a drawer: a button opens and closes it, Escape closes it. */
function trayDrawer() {
  const tray = document.getElementById("tray");
  if (!tray) return;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "btn primary tray-toggle";
  button.setAttribute("aria-controls", "tray");
  button.setAttribute("aria-expanded", "false");
  const count = document.createElement("span");
  count.className = "count";
  button.append("Deployments ", count);
  const showCount = () => {
    count.textContent = tray.querySelector(".tray-head .count")?.textContent || "";
  };
  /** @param {boolean} open */
  const setOpen = (open) => {
    tray.classList.toggle("is-open", open);
    button.setAttribute("aria-expanded", String(open));
  };
  button.addEventListener("click", () => {
    showCount();
    const open = !tray.classList.contains("is-open");
    setOpen(open);
    // Keyboard and screen-reader users land in the drawer they opened.
    if (open) /** @type {HTMLElement | null} */ (tray.querySelector(".dep, select"))?.focus();
  });
  document.addEventListener("keydown", (event) => {
    const modal = document.querySelector("dialog[open]");
    if (event.key === "Escape" && !modal && tray.classList.contains("is-open")) {
      setOpen(false);
      button.focus();
    }
  });
  // A wide screen shows the tray beside the GPUs: the drawer's state no longer applies.
  NARROW.addEventListener("change", () => setOpen(false));
  showCount();
  tray.after(button);
}

trayDrawer();
