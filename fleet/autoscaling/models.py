"""A deployment's autoscaling policy, and what its last evaluation found."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.allocations.models import Deployment
from fleet.core.models import TimeStampedModel


class Metric(models.TextChoices):
    REQUESTS = "requests_per_replica_per_s", "requests per replica per second"
    IN_FLIGHT = "in_flight_per_replica", "requests in flight per replica"
    GPU_UTILIZATION = "gpu_utilization_percent", "GPU utilisation (%)"
    REPLICA_METRIC = "replica_metric", "the replicas' own Prometheus metric"


class Aggregate(models.TextChoices):
    """How a replica metric's readings make the value per ready replica."""

    AVERAGE = "average", "average over the replicas that report it"
    SUM = "sum", "sum over the ready replicas, divided by their number"


class ScalingState(models.TextChoices):
    STEADY = "steady", "steady"
    SCALING_OUT = "scaling_out", "scaling out"
    SCALING_IN = "scaling_in", "scaling in"
    BLOCKED_QUOTA = "blocked_quota", "scaling blocked: quota"
    BLOCKED_CAPACITY = "blocked_capacity", "scaling blocked: capacity"
    NO_METRIC = "no_metric", "no metric"


class ScalingPolicy(TimeStampedModel):
    """Target tracking on one metric (:mod:`fleet.autoscaling.rule`), evaluated by beat."""

    deployment = models.OneToOneField(
        Deployment, primary_key=True, on_delete=models.CASCADE, related_name="autoscaling"
    )
    min_replicas = models.PositiveIntegerField()
    max_replicas = models.PositiveIntegerField()
    metric = models.CharField(max_length=32, choices=Metric.choices)
    target = models.FloatField()
    scale_out_cooldown_s = models.PositiveIntegerField(default=30)
    scale_in_cooldown_s = models.PositiveIntegerField(default=300)
    # min 0: how long a request that finds no replica is held while the first one starts.
    activation_timeout_s = models.PositiveIntegerField(default=300)
    # replica_metric: which metric of the replicas' own, read by their agents
    # (hostagent.runtime.metrics) at http://<replica>:<port><path>; blank for the others.
    metric_name = models.CharField(max_length=200, blank=True)
    metric_port = models.CharField(max_length=15, blank=True)
    metric_path = models.CharField(max_length=200, blank=True)
    metric_aggregate = models.CharField(max_length=8, choices=Aggregate.choices, blank=True)
    last_scale_out_at = models.DateTimeField(null=True, blank=True)
    last_scale_in_at = models.DateTimeField(null=True, blank=True)
    # What the last evaluation saw and decided, for the page and the API.
    state = models.CharField(max_length=20, choices=ScalingState.choices, default="steady")
    reason = models.CharField(max_length=200, blank=True)
    value = models.FloatField(null=True, blank=True)  # the metric per ready replica
    evaluated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(min_replicas__gte=0)
                & Q(max_replicas__gte=1)
                & Q(max_replicas__gte=models.F("min_replicas"))
                & Q(max_replicas__lte=1000),
                name="autoscaling_bounds",
            ),
            models.CheckConstraint(condition=Q(target__gt=0), name="autoscaling_target"),
        ]

    def __str__(self) -> str:
        return f"autoscaling of {self.deployment_id}: {self.metric} {self.target}"
