"""``GET /allocations/{id}/metrics``: the query and the answer of a replica's series."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.allocations.telemetry import MAX_POINTS, WINDOWS
from fleet.inventory.selectors import HISTORY_MAX_POINTS, HISTORY_WINDOWS


class ReplicaMetricsQuerySerializer(serializers.Serializer[Any]):
    window = serializers.ChoiceField(
        choices=list(WINDOWS),
        default="1h",
        help_text="1h: 1 s points of the hot store; 24h and 7d: per-minute means. Each window is "
        f"cut into at most {MAX_POINTS} buckets.",
    )


class ReplicaPointSerializer(serializers.Serializer[Any]):
    ts = serializers.FloatField(help_text="Unix seconds, the start of the bucket.")
    utilization_percent = serializers.FloatField(
        allow_null=True,
        help_text="null where there is no value: a MIG instance without GPM (before Hopper), "
        "an MPS share (no per-client utilisation), no sample in the bucket.",
    )
    memory_used_mib = serializers.FloatField(
        allow_null=True, help_text="null where there is no value (no attributed process)."
    )


class ReplicaMetricsSerializer(serializers.Serializer[Any]):
    allocation = serializers.IntegerField()
    window = serializers.ChoiceField(choices=list(WINDOWS))
    bucket_s = serializers.IntegerField(help_text="Seconds each point's mean covers.")
    points = ReplicaPointSerializer(many=True)

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # ``source`` names a Field attribute too: declared here, not as a class attribute.
        fields = super().get_fields()
        fields["source"] = serializers.ChoiceField(
            choices=["mig_instance", "processes", "gpu"],
            help_text="Where the values come from: the replica's MIG instance; the memory of "
            "the processes the agent attributes to it (MPS); for a whole GPU, the GPU's "
            "utilisation and its processes' memory.",
        )
        return fields


class GpuHistoryQuerySerializer(serializers.Serializer[Any]):
    window = serializers.ChoiceField(
        choices=list(HISTORY_WINDOWS),
        default="1h",
        help_text="1h: the hot store's 1 s points; 24h and 7d: per-minute means. Each window is "
        f"cut into at most {HISTORY_MAX_POINTS} buckets.",
    )


class GpuPointSerializer(serializers.Serializer[Any]):
    t = serializers.FloatField(help_text="Unix seconds, the start of the bucket.")
    utilization_percent = serializers.FloatField(
        allow_null=True, help_text="null: no value (MIG mode has none; no sample in the bucket)."
    )
    memory_used_mib = serializers.FloatField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)


class GpuHistorySerializer(serializers.Serializer[Any]):
    gpu = serializers.IntegerField()
    window = serializers.ChoiceField(choices=list(HISTORY_WINDOWS))
    bucket_s = serializers.IntegerField(help_text="Seconds each point's mean covers.")
    points = GpuPointSerializer(many=True)
