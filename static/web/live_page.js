// @ts-check
// A page with nothing live to redraw (alerts, usage) still opens the live socket: the header
// then says "Live" rather than "Connecting…" for good, and a revoked session is closed here too.
import { refreshOnChanges } from "./core.js";

refreshOnChanges(
  () => false,
  () => {},
);
