// @ts-check
// GPUs a plan involves, outlined on the fleet view: `/?highlight=3,7,9` (the capacity page's
// repack proposal links here). One style rule keyed on the cards' ids, so a card redrawn by a
// live change or drawn later as the page scrolls stays outlined; a status line names them.

const ids = (new URLSearchParams(location.search).get("highlight") || "")
  .split(",")
  .map((s) => s.trim())
  .filter((s) => /^\d+$/.test(s))
  .slice(0, 1000);

/** The GPU ids outlined. */
export const highlighted = ids.map(Number);

if (ids.length) {
  const style = document.createElement("style");
  style.id = "highlight-style";
  style.textContent = `${ids.map((id) => `#gpu-${id}`).join(", ")} { outline: 3px solid var(--accent); outline-offset: 2px; }`;
  document.head.append(style);
  const note = document.getElementById("highlight-note");
  if (note) {
    note.textContent = `${ids.length === 1 ? "1 GPU" : `${ids.length} GPUs`} of the repack proposal outlined.`;
    note.hidden = false;
  }
}
