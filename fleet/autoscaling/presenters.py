"""A deployment's autoscaling as the dashboard shows it: its policy in words, and what the last
evaluation found."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fleet.allocations.models import Deployment
from fleet.autoscaling.history import HistoryChart, history_chart, history_of
from fleet.autoscaling.models import Metric, ScalingPolicy, ScalingState

UNITS = {
    Metric.REQUESTS: "req/s per replica",
    Metric.IN_FLIGHT: "in flight per replica",
    Metric.GPU_UTILIZATION: "% GPU utilisation",
    Metric.REPLICA_METRIC: "per replica",
}
TONES = {
    ScalingState.STEADY: "ok",
    ScalingState.SCALING_OUT: "info",
    ScalingState.SCALING_IN: "info",
    ScalingState.BLOCKED_QUOTA: "bad",
    ScalingState.BLOCKED_CAPACITY: "bad",
    ScalingState.NO_METRIC: "warn",
}


@dataclass(frozen=True)
class AutoscalingPanel:
    min: int
    max: int
    metric: str
    metric_label: str
    unit: str
    target: float
    value: float | None  # per ready replica, at the last evaluation; None: no value
    state: str
    state_label: str
    tone: str
    reason: str
    evaluated_at: datetime | None
    scale_out_cooldown_s: int
    scale_in_cooldown_s: int
    activation_timeout_s: int
    # replica_metric's spec ("" for the other metrics): the form shows it to change it
    metric_name: str = ""
    metric_port: str = ""
    metric_path: str = ""
    metric_aggregate: str = ""

    @property
    def badge(self) -> str:
        """The deployments list's word: ``auto 1-8``."""
        return f"auto {self.min}-{self.max}"


def autoscaling_panel(deployment: Deployment) -> AutoscalingPanel | None:
    """``None`` when it has no policy (``select_related("autoscaling")`` saves the query)."""
    try:
        policy: ScalingPolicy = deployment.autoscaling
    except ScalingPolicy.DoesNotExist:
        return None
    metric = Metric(policy.metric) if policy.metric in Metric.values else None
    state = ScalingState(policy.state) if policy.state in ScalingState.values else None
    return AutoscalingPanel(
        min=policy.min_replicas,
        max=policy.max_replicas,
        metric=policy.metric,
        metric_label=(policy.metric_name or metric.label) if metric else policy.metric,
        unit=UNITS.get(metric, "") if metric else "",
        target=policy.target,
        value=policy.value,
        state=policy.state,
        state_label=state.label if state else policy.state,
        tone=TONES.get(state, "info") if state else "info",
        reason=policy.reason,
        evaluated_at=policy.evaluated_at,
        scale_out_cooldown_s=policy.scale_out_cooldown_s,
        scale_in_cooldown_s=policy.scale_in_cooldown_s,
        activation_timeout_s=policy.activation_timeout_s,
        metric_name=policy.metric_name,
        metric_port=policy.metric_port,
        metric_path=policy.metric_path,
        metric_aggregate=policy.metric_aggregate,
    )


def autoscaling_chart(
    deployment: Deployment, panel: AutoscalingPanel | None
) -> HistoryChart | None:
    """Its page's chart: the replica count over the last hour against the metric and the target
    (:mod:`fleet.autoscaling.history`); ``None`` when it has no policy."""
    if panel is None:
        return None
    return history_chart(history_of(deployment.pk), target=panel.target, most=panel.max)
