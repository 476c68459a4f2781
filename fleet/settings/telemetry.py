"""Telemetry and the live sockets: the hot store's window, retention, the GPU-map cache, the
batch window, degrading under load, and the ASGI server's garbage collector."""

from __future__ import annotations

from fleet.settings.env import env_bool, env_float, env_floats, env_int

# Telemetry: the hot store's 1 s window, how long per-minute means are kept, how long a
# process caches a host's GPU map, and the agent sockets' batch window (fleet.live.ingest).
FLEET_TELEMETRY_RAW_SECONDS = env_int("FLEET_TELEMETRY_RAW_SECONDS", 3600)
FLEET_TELEMETRY_KEEP_SECONDS = env_int("FLEET_TELEMETRY_KEEP_SECONDS", 7 * 86400)
FLEET_TELEMETRY_GPU_CACHE_SECONDS = env_float("FLEET_TELEMETRY_GPU_CACHE_SECONDS", 60.0)
FLEET_LIVE_BATCH_SECONDS = env_float("FLEET_LIVE_BATCH_SECONDS", 0.25)
# Past its capacity an ASGI process coarsens telemetry instead of falling behind
# (fleet.live.load): agents are asked to report every N s at the "busy" and "overloaded" levels.
FLEET_LIVE_DEGRADE = env_bool("FLEET_LIVE_DEGRADE", True)
FLEET_LIVE_DEGRADED_INTERVALS = env_floats(
    "FLEET_LIVE_DEGRADED_INTERVALS", (2.0, 3.0), low=1.0, high=10.0
)
# The ASGI server's young-generation collection threshold (fleet.asgi; Python's default: 700).
FLEET_GC_THRESHOLD = env_int("FLEET_GC_THRESHOLD", 10_000)
