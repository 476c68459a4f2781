"""Setting a deployment's autoscaling policy: checked, stored, audited; ``None`` removes it.

The policy as clients write it::

    {"min": 1, "max": 8,
     "target": {"requests_per_replica_per_s": 4},
     "scale_out_cooldown_s": 30, "scale_in_cooldown_s": 300}

``target`` names exactly one metric (:class:`fleet.autoscaling.models.Metric`). The balancer's
metrics need the deployment to have an endpoint. ``min`` 0 scales to zero: it needs a balancer
metric (a replica's utilisation cannot wake a deployment that has none), and the gateways hold
the requests that find no replica for ``activation_timeout_s`` (300) while the first one
starts (:mod:`fleet.endpoints.activator`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from fleet.allocations.models import Deployment
from fleet.autoscaling.models import Metric, ScalingPolicy
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.endpoints.models import Endpoint

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
        "min_replicas": low,
        "max_replicas": high,
        "metric": metric,
        "target": float(value),
        "scale_out_cooldown_s": _whole(spec, "scale_out_cooldown_s", 30, 0, 3600),
        "scale_in_cooldown_s": _whole(spec, "scale_in_cooldown_s", 300, 0, 86_400),
        "activation_timeout_s": _whole(spec, "activation_timeout_s", 300, 1, 3600),
    }


def as_spec(policy: ScalingPolicy) -> dict[str, Any]:
    """The policy as clients write it (and read it back)."""
    return {
        "min": policy.min_replicas,
        "max": policy.max_replicas,
        "target": {policy.metric: policy.target},
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
        policy, _ = ScalingPolicy.objects.update_or_create(deployment=deployment, defaults=fields)
        _record(
            deployment,
            f"Autoscaling of {deployment.name}: {policy.min_replicas}-{policy.max_replicas} "
            f"replicas, {policy.metric} at {policy.target:g}",
            requested_by,
        )
        return policy


def _record(deployment: Deployment, summary: str, requested_by: Any) -> None:
    operation_record(
        kind=OperationKind.SET_AUTOSCALING,
        summary=summary,
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        deployment=deployment,
    )
    publish_changed("deployment", [deployment.pk])
