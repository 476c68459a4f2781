// @ts-check
// The deployments list: its rows are re-rendered by the server after a change (unchanged rows,
// by their data-sig, stay as they are).
import { debounce, refreshOnChanges, refreshRows } from "./core.js";
import { wirePlacing } from "./placing.js";

const body = /** @type {HTMLElement} */ (document.getElementById("deployments-body"));
const empty = document.getElementById("deployments-empty");

const team = document.getElementById("deployments-panel")?.dataset.team;
const url = team ? `/ui/deployments?team=${encodeURIComponent(team)}` : "/ui/deployments";
const refresh = debounce(() => refreshRows(url, body, "tr.dep-row", { empty }), 400);

// A replica's state moves with its deployment; an agent's ack finishes an operation.
refreshOnChanges((c) => c.deployment || c.allocation || c.operation, refresh);

// Place all and Place… on the rows of deployments whose next replica fits now.
wirePlacing(body);
