"""What an evaluation reads: the deployment's replicas (placed, ready) and its metric.

* ``requests_per_replica_per_s`` and ``in_flight_per_replica`` come from the balancer: the
  gateways' readings of the endpoint (:mod:`fleet.endpoints.traffic`), totals over the ready
  replicas (in flight counts the requests queued at the endpoint too: they wait for a replica);
* ``gpu_utilization_percent`` from the replicas' own telemetry (their MIG instance, their MPS
  processes, or their GPU: :mod:`fleet.inventory.telemetry`), the mean of the last
  :data:`UTILIZATION_WINDOW_S` seconds over the ready replicas that have a value. Where NVML has
  none (a MIG instance on Ampere), there is no metric, not 0;
* ``replica_metric`` from the replicas' own Prometheus endpoints, read by their agents
  (:mod:`hostagent.runtime.metrics`): each ready replica's latest reading, no older than
  :data:`READING_FRESH_S`, averaged over the replicas that have one (``average``) or summed
  (``sum``: the rule divides by every ready replica, so one without a reading counts 0). No
  ready replica with a reading (an agent older than replica metrics, an endpoint that does not
  answer, a metric the workload does not expose) is no value, with the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.ports import allocation_ready
from fleet.autoscaling.models import Aggregate, Metric, ScalingPolicy
from fleet.endpoints.traffic import traffic_of
from fleet.inventory.telemetry import ROLLUP_SECONDS, get_store, unpack_replicas

UTILIZATION_WINDOW_S = 30.0
READING_FRESH_S = 30.0


@dataclass(frozen=True)
class MetricValue:
    """The metric as :class:`fleet.autoscaling.rule.Observation` takes it (``value`` a total,
    or a mean when not ``additive``), or ``None`` and ``problem``: why there is none."""

    value: float | None
    additive: bool = True
    problem: str = ""


@dataclass(frozen=True)
class Replicas:
    placed: list[Allocation]  # the first GPU of each replica in place, not releasing
    ready: list[Allocation]
    moving: set[int]  # replica indices with a move's new copy in flight


def replicas_of(deployment: Deployment) -> Replicas:
    rows = list(
        Allocation.objects.placed()
        .filter(deployment=deployment, gpu_slot=0)
        .select_related("gpu__host")
        .order_by("replica", "pk")
    )
    moving = {a.replica for a in rows if a.replaces_id is not None}
    placed = [a for a in rows if a.replaces_id is None]
    ready = [a for a in placed if allocation_ready(a)]
    return Replicas(placed, ready, moving)


def metric_value(deployment: Deployment, metric: str, ready: list[Allocation]) -> float | None:
    """The metric as :class:`fleet.autoscaling.rule.Observation` takes it: a total over the
    ready replicas (requests, in flight), or their mean (utilisation); ``None``: no value."""
    if metric in (Metric.REQUESTS, Metric.IN_FLIGHT):
        traffic = traffic_of([deployment.pk]).get(deployment.pk)
        if traffic is None:
            return None
        if metric == Metric.REQUESTS:
            return traffic.requests_per_s
        return float(traffic.in_flight + traffic.queued)
    if metric == Metric.GPU_UTILIZATION:
        return _mean_utilization(ready)
    return None


def policy_metric(
    deployment: Deployment, policy: ScalingPolicy, ready: list[Allocation]
) -> MetricValue:
    """The policy's metric over the ready replicas (see the module's docstring)."""
    if policy.metric == Metric.REPLICA_METRIC:
        return replica_metric_value(policy, ready)
    value = metric_value(deployment, policy.metric, ready)
    return MetricValue(value, additive=policy.metric != Metric.GPU_UTILIZATION)


def replica_metric_value(
    policy: ScalingPolicy, ready: list[Allocation], now: float | None = None
) -> MetricValue:
    """The replicas' own metric: the mean (``average``) or the total (``sum``) of the ready
    replicas' fresh readings."""
    additive = policy.metric_aggregate == Aggregate.SUM
    if not ready:
        return MetricValue(None, additive, "no replica is ready")
    now = time.time() if now is None else now
    stored = get_store().replica_readings([a.pk for a in ready])
    values: list[float] = []
    problems: list[str] = []
    for allocation in ready:
        reading = stored.get(allocation.pk, {}).get(policy.metric_name)
        if reading is None or reading["received_at"] < now - READING_FRESH_S:
            continue
        if reading["value"] is None:
            problems.append(reading["error"])
        else:
            values.append(float(reading["value"]))
    if not values:
        why = (
            problems[0]
            if problems
            else (
                "no ready replica's agent reports it (agents older than replica metrics read none)"
            )
        )
        return MetricValue(None, additive, f"{policy.metric_name} not available: {why}")
    total = sum(values)
    return MetricValue(total if additive else total / len(values), additive)


def _mean_utilization(ready: list[Allocation], now: float | None = None) -> float | None:
    now = time.time() if now is None else now
    since = now - UTILIZATION_WINDOW_S
    store = get_store()
    hosts = sorted({a.gpu.host_id for a in ready})
    wanted = {a.pk for a in ready}
    sums: dict[int, list[float]] = {}
    for minute in range(int(since // ROLLUP_SECONDS), int(now // ROLLUP_SECONDS) + 1):
        buckets = store.replica_buckets(hosts, minute)
        for data in buckets.values():
            for allocation_id, point in unpack_replicas(minute, data):
                util = point["utilization_percent"]
                if allocation_id in wanted and util is not None and since <= point["ts"] <= now:
                    sums.setdefault(allocation_id, []).append(util)
    means = [sum(values) / len(values) for values in sums.values() if values]
    return sum(means) / len(means) if means else None
