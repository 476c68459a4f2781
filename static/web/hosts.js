// @ts-check
// The hosts list: its rows are re-rendered by the server after a change (unchanged rows, by
// their data-sig, stay as they are).
import { debounce, refreshOnChanges, refreshRows } from "./core.js";

const body = /** @type {HTMLElement} */ (document.getElementById("hosts-body"));
const empty = document.getElementById("hosts-empty");

const refresh = debounce(() => refreshRows("/ui/host-rows", body, "tr.host-row", { empty }), 400);

// A host's status, labels or agent; a drain (an operation) scheduled, started or finished.
refreshOnChanges((c) => c.host || c.operation, refresh);
