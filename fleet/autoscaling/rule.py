"""The decision rule: target tracking, as SageMaker's and the Kubernetes HPA's (pure).

``desired = ceil(ready * per_replica / target)``, bounded by ``min`` and ``max``:

* **tolerance**: no change while ``per_replica / target`` stays within ±10 % of 1, so a metric
  hovering at its target does not flap;
* **replicas that are not ready do not count**: the metric is per *ready* replica, and a
  deployment whose new replicas are still starting scales out again only once the ready ones
  alone would need more than it has (HPA's rule, not ``ceil(replicas * ratio)``, which would
  scale out again on every evaluation while a new replica starts); it scales in only when every
  replica is ready;
* **scale-out is fast, scale-in slow**: a scale-out waits ``scale_out_cooldown_s`` after the last
  scale-out; a scale-in waits ``scale_in_cooldown_s`` after the last scaling either way (the
  services count a policy's creation as one: its first reading may come before the traffic);
* **scale-in is stabilised** (the HPA's scale-down stabilization window): it goes no lower than
  the most replicas the rule wanted over the last ``scale_in_cooldown_s`` (``recent_desired``),
  so one quiet reading between two bursts does not take away the replicas the next burst needs
  (``bench_autoscale`` on the code trace went from 16 replicas to 1 and back within 2 s);
* **a scale-out step limit** (``max_step_out``, off unless set: the HPA's default scale-up
  policy is the larger of +100 % and +4 pods per period): one scale-out adds at most that many
  replicas, or doubles the count when that is more; the next step follows after the scale-out
  cooldown, so a reading inflated by a queue built while replicas start does not go straight to
  ``max``;
* a count outside ``[min, max]`` (the policy changed) is brought back at once;
* **scale to zero** (``min`` 0, a balancer metric): no traffic for the scale-in cooldown takes
  the last replica away; at zero, any request (the balancer counts it while it holds it, see
  :mod:`fleet.endpoints.activator`) brings back ``ceil(demand / target)`` replicas, one at
  least, without a cooldown.

A metric with no value (no gateway measured the endpoint; NVML has no utilisation for the
replica's MIG instance) changes nothing: the decision says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

TOLERANCE = 0.1

Action = Literal["out", "in", "hold"]


@dataclass(frozen=True)
class Limits:
    min: int
    max: int
    target: float
    scale_out_cooldown_s: float = 30.0
    scale_in_cooldown_s: float = 300.0
    tolerance: float = TOLERANCE
    # At most this many replicas added by one scale-out (or doubled, when that is more);
    # None: no limit.
    max_step_out: int | None = None


@dataclass(frozen=True)
class Observation:
    """``value``: the metric over the ready replicas, as a total (``additive``: requests per
    second, requests in flight) or as their mean (utilisation). ``since_*``: seconds since the
    last scaling of that kind (``None``: never)."""

    replicas: int
    ready: int
    value: float | None
    additive: bool = True
    since_scale_out_s: float | None = None
    since_scale_in_s: float | None = None
    # The most replicas the rule wanted (before the bounds) over the last scale_in_cooldown_s;
    # None: not known (scale-in then follows this reading alone).
    recent_desired: int | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    replicas: int  # the count to set (the current one when holding)
    reason: str
    per_replica: float | None = None  # the metric per ready replica
    desired: int | None = None  # before the bounds


def _elapsed(since: float | None, cooldown: float) -> bool:
    return since is None or since >= cooldown


def decide(limits: Limits, obs: Observation) -> Decision:
    """The decision for one evaluation (see the module's docstring)."""
    now = obs.replicas
    if now < limits.min:
        return Decision("out", limits.min, f"below the policy's minimum of {limits.min}")
    if now > limits.max:
        return Decision("in", limits.max, f"above the policy's maximum of {limits.max}")
    if obs.value is None:
        return Decision("hold", now, "the metric has no value now")
    if now == 0:
        if obs.value <= 0:
            return Decision("hold", 0, "scaled to zero: no request")
        wanted = max(1, math.ceil(obs.value / limits.target - 1e-9)) if obs.additive else 1
        return Decision("out", min(limits.max, wanted), "requests arrived at zero replicas")
    if obs.ready <= 0:
        return Decision("hold", now, "no replica is ready yet")
    per_replica = obs.value / obs.ready if obs.additive else obs.value
    ratio = per_replica / limits.target
    desired = max(0, math.ceil(obs.ready * ratio - 1e-9))
    bounded = min(limits.max, max(limits.min, desired))

    def hold(reason: str) -> Decision:
        return Decision("hold", now, reason, per_replica, desired)

    if abs(ratio - 1.0) <= limits.tolerance:
        return hold("within 10 % of the target")
    if bounded > now:
        if not _elapsed(obs.since_scale_out_s, limits.scale_out_cooldown_s):
            return hold(f"scale-out cooldown ({limits.scale_out_cooldown_s:g} s)")
        if limits.max_step_out is not None and bounded > now + max(limits.max_step_out, now):
            stepped = now + max(limits.max_step_out, now)
            return Decision(
                "out",
                stepped,
                f"above the target (a step of {stepped - now})",
                per_replica,
                desired,
            )
        return Decision("out", bounded, "above the target", per_replica, desired)
    if bounded < now:
        if obs.ready < now:
            return hold(f"{now - obs.ready} replica(s) not ready: no scale-in while starting")
        since = min(
            (s for s in (obs.since_scale_in_s, obs.since_scale_out_s) if s is not None),
            default=None,
        )
        if not _elapsed(since, limits.scale_in_cooldown_s):
            return hold(f"scale-in cooldown ({limits.scale_in_cooldown_s:g} s)")
        if obs.recent_desired is not None:
            floor = min(limits.max, max(limits.min, obs.recent_desired))
            if floor >= now:
                return hold(
                    f"scale-in stabilization: {obs.recent_desired} replica(s) wanted in the last "
                    f"{limits.scale_in_cooldown_s:g} s"
                )
            bounded = max(bounded, floor)
        return Decision("in", bounded, "below the target", per_replica, desired)
    if desired > now:
        return hold(f"at the policy's maximum of {limits.max}")
    if desired < now:
        return hold(f"at the policy's minimum of {limits.min}")
    if obs.ready < now:
        return hold(f"{obs.ready} ready replica(s) need {desired}: waiting for the starting ones")
    return hold(f"{desired} replica(s) meet the target")
