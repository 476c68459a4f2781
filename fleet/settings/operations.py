"""Long-running operations: how long an operation, a move and a rolling update's new copy may
take, and the solvers' time limits (repack, the layout advisor)."""

from __future__ import annotations

from fleet.settings.env import env_bool, env_float, env_int

FLEET_OPERATION_TIMEOUT_SECONDS = env_float("FLEET_OPERATION_TIMEOUT_SECONDS", 300.0)
# A move's new copy must run within this, or the move is rolled back (the old copy stays).
FLEET_MOVE_TIMEOUT_SECONDS = env_float("FLEET_MOVE_TIMEOUT_SECONDS", 300.0)
# A rolling update's new copy counts once it has stayed running this long (minReadySeconds).
FLEET_ROLLOUT_MIN_READY_SECONDS = env_int("FLEET_ROLLOUT_MIN_READY_SECONDS", 10)
# CP-SAT's wall-clock limit for a repack proposal (the greedy plan answers past it).
FLEET_REPACK_TIME_LIMIT_SECONDS = env_float("FLEET_REPACK_TIME_LIMIT_SECONDS", 3.0)
# The layout advisor (GET /api/v1/capacity/advice, operators) runs CP-SAT for up to 10 s: one
# solve per user per this many seconds (0: no limit), and one at a time per server process.
FLEET_ADVICE_MIN_INTERVAL_SECONDS = env_float("FLEET_ADVICE_MIN_INTERVAL_SECONDS", 30.0)
# How many layout-advisor solves may run at once in one server process (each uses 8 threads).
FLEET_ADVISOR_CONCURRENCY = env_int("FLEET_ADVISOR_CONCURRENCY", 1)
# The queue compares teams by their use decayed with this half-life (docs/sharing.md): 7 days.
FLEET_FAIRSHARE_HALF_LIFE_S = env_float("FLEET_FAIRSHARE_HALF_LIFE_S", 7 * 86400.0)
# A borrowed replica younger than this is never stopped by a reclaim (moves are fine).
FLEET_RECLAIM_MIN_RUNTIME_S = env_float("FLEET_RECLAIM_MIN_RUNTIME_S", 600.0)
# Reclaims that may run at once, fleet-wide; each touches GPUs no other running one touches.
FLEET_RECLAIM_CONCURRENCY = env_int("FLEET_RECLAIM_CONCURRENCY", 8)
# A claimant whose reclaim failed is not tried again for this long (a failing move, say).
FLEET_RECLAIM_RETRY_S = env_float("FLEET_RECLAIM_RETRY_S", 60.0)
# The engine carries out the moves that would place the head of the queue (docs/sharing.md).
FLEET_QUEUE_DEFRAG = env_bool("FLEET_QUEUE_DEFRAG", True)
# What would it take? The layout advisor's limit per GPU product in the background refresh.
FLEET_WIT_ADVICE_SECONDS = env_float("FLEET_WIT_ADVICE_SECONDS", 2.0)
# One background refresh of "what would it take?" stops after this long; the next goes on.
FLEET_WIT_REFRESH_BUDGET_S = env_float("FLEET_WIT_REFRESH_BUDGET_S", 20.0)
