"""A deployment's autoscaling policy, as the API reads and writes it (the service checks what is
written: :func:`fleet.autoscaling.policy.checked`)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.autoscaling.models import ScalingPolicy, ScalingState
from fleet.autoscaling.policy import as_spec


class ReplicaMetricSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(
        max_length=200,
        help_text="A Prometheus metric name the workload exposes, e.g. "
        "`vllm:num_requests_waiting`; a replica's value is the sum of its samples (every "
        "label set).",
    )
    value = serializers.FloatField(help_text="The target per replica (above 0).")
    port = serializers.CharField(
        max_length=15, help_text="One of the workload's declared ports (by name)."
    )
    path = serializers.CharField(
        required=False, max_length=200, help_text="The exposition's path (`/metrics`)."
    )
    aggregate = serializers.ChoiceField(
        choices=["average", "sum"],
        required=False,
        help_text="`average` over the ready replicas that report it (default), or `sum` "
        "divided by every ready replica (one without a reading counts 0).",
    )


class AutoscalingTargetSerializer(serializers.Serializer[Any]):
    requests_per_replica_per_s = serializers.FloatField(
        required=False, help_text="Requests per second per ready replica, from the gateways."
    )
    in_flight_per_replica = serializers.FloatField(
        required=False,
        help_text="Requests being served or queued per ready replica, from the gateways.",
    )
    gpu_utilization_percent = serializers.FloatField(
        required=False,
        help_text="Mean GPU utilisation of the ready replicas (their MIG instance, MPS processes "
        "or GPU), over 30 s.",
    )
    replica_metric = ReplicaMetricSerializer(
        required=False,
        help_text="The replicas' own Prometheus metric, read by their agents every 5 s from "
        "the workload's port.",
    )


class AutoscalingSerializer(serializers.Serializer[Any]):
    min = serializers.IntegerField(
        min_value=0,
        max_value=1000,
        help_text="Fewest replicas; 0 scales to zero (a balancer metric only): requests that "
        "find no replica are held at the endpoint while the first one starts.",
    )
    max = serializers.IntegerField(min_value=1, max_value=1000, help_text="Most replicas.")
    target = AutoscalingTargetSerializer(
        help_text="Exactly one metric and the value per ready replica to hold it at."
    )
    scale_out_cooldown_s = serializers.IntegerField(
        required=False, min_value=0, max_value=3600, help_text="After a scale-out (30)."
    )
    scale_in_cooldown_s = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=86_400,
        help_text="After any scaling, before a scale-in (300).",
    )
    activation_timeout_s = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=3600,
        help_text="At zero replicas, how long a request is held for the first one (300); then 503.",
    )


class AutoscalingReadSerializer(AutoscalingSerializer):
    state = serializers.ChoiceField(
        choices=ScalingState.choices,
        help_text="What the last evaluation found: `blocked_quota` is 'scaling blocked: quota'.",
    )
    reason = serializers.CharField(help_text="The last evaluation's reason, in words.")
    value = serializers.FloatField(
        allow_null=True, help_text="The metric per ready replica at the last evaluation."
    )
    evaluated_at = serializers.DateTimeField(allow_null=True)


def autoscaling_read(deployment: Any) -> dict[str, Any] | None:
    try:
        policy: ScalingPolicy = deployment.autoscaling
    except ScalingPolicy.DoesNotExist:
        return None
    return {
        **as_spec(policy),
        "state": policy.state,
        "reason": policy.reason,
        "value": policy.value,
        "evaluated_at": policy.evaluated_at,
    }
