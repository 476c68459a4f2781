// @ts-check
// The team pages: the usage beside each limit follows the replicas live (the page's own tables
// are re-read from the server after a change; the admin forms are left as they are).
import { debounce, refreshOnChanges, refreshParts } from "./core.js";

const TABLES = ["#teams tbody", "#team-limits tbody"];

const refresh = debounce(() => refreshParts(location.pathname, TABLES), 800);

refreshOnChanges((c) => c.deployment || c.allocation || c.operation, refresh);
