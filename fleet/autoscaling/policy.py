"""Setting a deployment's autoscaling policy: checked, stored, audited; ``None`` removes it.

The policy as clients write it::

    {"min": 1, "max": 8,
     "target": {"requests_per_replica_per_s": 4},
     "scale_out_cooldown_s": 30, "scale_in_cooldown_s": 300}

``target`` names exactly one metric (:class:`fleet.autoscaling.models.Metric`). The balancer's
metrics need the deployment to have an endpoint. A replica's own Prometheus metric is an object
(:func:`_replica_metric`)::

    "target": {"replica_metric": {"name": "vllm:num_requests_waiting", "value": 5,
                                  "port": "metrics", "path": "/metrics", "aggregate": "average"}}

``port`` is one of the workload's declared ports; ``path`` defaults to ``/metrics``,
``aggregate`` to ``average``. ``min`` 0 scales to zero: it needs a balancer
metric (a replica's utilisation cannot wake a deployment that has none), and the gateways hold
the requests that find no replica for ``activation_timeout_s`` (300) while the first one
starts (:mod:`fleet.endpoints.activator`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from django.db import transaction

from fleet.allocations.models import Deployment
from fleet.allocations.resend import resend_on_commit
from fleet.allocations.workloads import workload_of
from fleet.autoscaling.models import Aggregate, Metric, ScalingPolicy
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.endpoints.models import Endpoint
from hostagent import protocol

FIELDS = (
    "min",
    "max",
    "target",
    "scale_out_cooldown_s",
    "scale_in_cooldown_s",
    "activation_timeout_s",
)
MAX_REPLICAS = 1000
TARGET_RANGES: dict[str, tuple[float, float]] = {
    Metric.REQUESTS: (0.01, 1_000_000.0),
    Metric.IN_FLIGHT: (0.1, 100_000.0),
    Metric.GPU_UTILIZATION: (1.0, 100.0),
}
BALANCER_METRICS = frozenset({Metric.REQUESTS, Metric.IN_FLIGHT})
REPLICA_METRIC_FIELDS = ("name", "value", "port", "path", "aggregate")
REPLICA_METRIC_MAX = 1e12
NAME_RE = re.compile(protocol.METRIC_NAME_PATTERN)
PATH_RE = re.compile(protocol.SCRAPE_PATH_PATTERN)
PORT_RE = re.compile(protocol.PORT_NAME_PATTERN)


def _invalid(message: str, field: str, **details: Any) -> ServiceError:
    return ServiceError("autoscaling.invalid", message, {"field": field, **details})


def _whole(spec: dict[str, Any], field: str, default: int | None, low: int, high: int) -> int:
    value = spec.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _invalid(f"'{field}' is a whole number from {low} to {high}.", field)
    return value


def checked(spec: Any) -> dict[str, Any]:
    """The policy's fields, checked (400 ``autoscaling.invalid`` naming the field)."""
    if not isinstance(spec, dict):
        raise _invalid("'autoscaling' is an object, or null to turn it off.", "autoscaling")
    unknown = sorted(str(k)[:40] for k in spec if k not in FIELDS)
    if unknown:
        raise _invalid(
            f"Unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}.", unknown[0]
        )
    low = _whole(spec, "min", None, 0, MAX_REPLICAS)
    high = _whole(spec, "max", None, 1, MAX_REPLICAS)
    if high < low:
        raise _invalid(f"'max' ({high}) is below 'min' ({low}).", "max")
    target = spec.get("target")
    if not isinstance(target, dict) or len(target) != 1:
        raise _invalid(
            f"'target' names one metric and its value, e.g. {{\"{Metric.REQUESTS}\": 4}}; "
            f"the metrics are {', '.join(Metric.values)}.",
            "target",
            metrics=list(Metric.values),
        )
    ((metric, value),) = target.items()
    if metric == Metric.REPLICA_METRIC:
        if low == 0:
            raise _invalid(
                "'min' 0 (scale to zero) needs a balancer metric: at zero replicas no replica "
                "reports its own metric.",
                "min",
            )
        return {**_bounds(spec, low, high), **_replica_metric(value)}
    if metric not in TARGET_RANGES:
        raise _invalid(
            f"Unknown metric {str(metric)[:60]!r}; the metrics are {', '.join(Metric.values)}.",
            "target",
            metrics=list(Metric.values),
        )
    if low == 0 and metric not in BALANCER_METRICS:
        raise _invalid(
            "'min' 0 (scale to zero) needs a balancer metric: at zero replicas only the requests "
            f"held at the endpoint can bring one back, not {metric}.",
            "min",
        )
    lo, hi = TARGET_RANGES[metric]
    if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
        raise _invalid(f"The target of {metric} is a number from {lo:g} to {hi:g}.", "target")
    return {
        **_bounds(spec, low, high),
        "metric": metric,
        "target": float(value),
        "metric_name": "",
        "metric_port": "",
        "metric_path": "",
        "metric_aggregate": "",
    }


def _bounds(spec: dict[str, Any], low: int, high: int) -> dict[str, Any]:
    return {
        "min_replicas": low,
        "max_replicas": high,
        "scale_out_cooldown_s": _whole(spec, "scale_out_cooldown_s", 30, 0, 3600),
        "scale_in_cooldown_s": _whole(spec, "scale_in_cooldown_s", 300, 0, 86_400),
        "activation_timeout_s": _whole(spec, "activation_timeout_s", 300, 1, 3600),
    }


def _replica_metric(spec: Any) -> dict[str, Any]:
    """The fields of a ``replica_metric`` target, checked (the port against the workload later,
    in :func:`autoscaling_set`)."""
    field = "target.replica_metric"
    if not isinstance(spec, dict):
        raise _invalid(
            f'\'{field}\' is an object: {{"name": "vllm:num_requests_waiting", "value": 5, '
            '"port": "metrics"}, with "path" (/metrics) and "aggregate" (average or sum).',
            field,
        )
    unknown = sorted(str(k)[:40] for k in spec if k not in REPLICA_METRIC_FIELDS)
    if unknown:
        raise _invalid(
            f"Unknown field {unknown[0]!r} of {field}; the fields are "
            f"{', '.join(REPLICA_METRIC_FIELDS)}.",
            f"{field}.{unknown[0]}",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _invalid(
            "'name' is a Prometheus metric name: a letter, '_' or ':', then letters, digits, '_' "
            "or ':', at most 200 characters.",
            f"{field}.name",
        )
    value = spec.get("value")
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 < value <= REPLICA_METRIC_MAX
    ):
        raise _invalid(
            f"'value' (the target per replica) is above 0, at most {REPLICA_METRIC_MAX:g}.",
            f"{field}.value",
        )
    port = spec.get("port")
    if not isinstance(port, str) or not PORT_RE.match(port):
        raise _invalid("'port' names one of the workload's declared ports.", f"{field}.port")
    path = spec.get("path", "/metrics")
    if not isinstance(path, str) or not PATH_RE.match(path):
        raise _invalid(
            "'path' starts with '/' and holds URL characters only, at most 200.", f"{field}.path"
        )
    aggregate = spec.get("aggregate", Aggregate.AVERAGE)
    if aggregate not in Aggregate.values:
        raise _invalid(
            f"'aggregate' is {' or '.join(Aggregate.values)}.",
            f"{field}.aggregate",
        )
    return {
        "metric": Metric.REPLICA_METRIC,
        "target": float(value),
        "metric_name": name,
        "metric_port": port,
        "metric_path": path,
        "metric_aggregate": str(aggregate),
    }


def as_spec(policy: ScalingPolicy) -> dict[str, Any]:
    """The policy as clients write it (and read it back)."""
    target: dict[str, Any] = {policy.metric: policy.target}
    if policy.metric == Metric.REPLICA_METRIC:
        target = {
            policy.metric: {
                "name": policy.metric_name,
                "value": policy.target,
                "port": policy.metric_port,
                "path": policy.metric_path,
                "aggregate": policy.metric_aggregate,
            }
        }
    return {
        "min": policy.min_replicas,
        "max": policy.max_replicas,
        "target": target,
        "scale_out_cooldown_s": policy.scale_out_cooldown_s,
        "scale_in_cooldown_s": policy.scale_in_cooldown_s,
        "activation_timeout_s": policy.activation_timeout_s,
    }


def autoscaling_set(
    *, deployment_id: int, spec: Any, requested_by: Any = None
) -> ScalingPolicy | None:
    """Give the deployment an autoscaling policy, change it, or (``spec`` ``None``) remove it.
    Refuses, changing nothing: 400 ``autoscaling.invalid``, 404 ``deployment.not_found``, 409
    ``deployment.deleting``, 422 ``autoscaling.needs_endpoint`` (a balancer metric without an
    endpoint)."""
    fields = None if spec is None else checked(spec)
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().filter(pk=deployment_id).first()
        if deployment is None:
            raise NotFound("deployment.not_found", f"Deployment {deployment_id} does not exist.")
        if deployment.deleting:
            raise Conflict(
                "deployment.deleting", f"{deployment.name} is being deleted: it does not scale."
            )
        current = ScalingPolicy.objects.filter(deployment=deployment).first()
        if _scrape_of(current) != _scrape_of(fields):
            # The agents read the replicas' metric only when told: send them the change (after
            # commit, in a transaction of each host's own, as the endpoints' drain does).
            resend_on_commit(deployment.pk)
        if fields is None:
            if current is None:
                return None
            current.delete()
            _record(deployment, f"Autoscaling of {deployment.name} turned off", requested_by)
            return None
        if (
            fields["metric"] in BALANCER_METRICS
            and not Endpoint.objects.filter(deployment=deployment).exists()
        ):
            raise ServiceError(
                "autoscaling.needs_endpoint",
                f"{fields['metric']} is measured by the balancer: give {deployment.name} an "
                "endpoint first, or scale on gpu_utilization_percent.",
                {"metric": fields["metric"]},
                status_code=422,
            )
        if fields["metric"] == Metric.REPLICA_METRIC:
            _check_port(deployment, fields["metric_port"])
        policy, _ = ScalingPolicy.objects.update_or_create(deployment=deployment, defaults=fields)
        _record(
            deployment,
            f"Autoscaling of {deployment.name}: {policy.min_replicas}-{policy.max_replicas} "
            f"replicas, {_metric_words(policy)} at {policy.target:g}",
            requested_by,
        )
        return policy


def _scrape_of(policy: ScalingPolicy | dict[str, Any] | None) -> tuple[str, ...]:
    """What the agents read for a policy (its fields or its row): empty unless a replica
    metric."""
    if policy is None:
        return ()
    row = policy if isinstance(policy, dict) else as_fields(policy)
    if row["metric"] != Metric.REPLICA_METRIC:
        return ()
    return (row["metric_name"], row["metric_port"], row["metric_path"])


def as_fields(policy: ScalingPolicy) -> dict[str, Any]:
    return {
        "metric": policy.metric,
        "metric_name": policy.metric_name,
        "metric_port": policy.metric_port,
        "metric_path": policy.metric_path,
    }


def _check_port(deployment: Deployment, port: str) -> None:
    declared = [p["name"] for p in protocol.declared_ports(workload_of(deployment, None))]
    if port not in declared:
        raise ServiceError(
            "autoscaling.port_unknown",
            f"{deployment.name}'s workload declares no port {port!r}"
            + (f" (it declares {', '.join(declared)})." if declared else ": it declares none.")
            + " Its agent reads the metric on a declared port.",
            {"field": "target.replica_metric.port", "declared": declared},
            status_code=422,
        )


def _record(deployment: Deployment, summary: str, requested_by: Any) -> None:
    operation_record(
        kind=OperationKind.SET_AUTOSCALING,
        summary=summary,
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        deployment=deployment,
    )
    publish_changed("deployment", [deployment.pk])


def _metric_words(policy: ScalingPolicy) -> str:
    if policy.metric == Metric.REPLICA_METRIC:
        return f"{policy.metric_name} ({policy.metric_aggregate} over the replicas)"
    return str(policy.metric)
