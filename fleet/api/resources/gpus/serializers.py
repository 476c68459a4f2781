"""GPUs: the GPU as the API shows it, its drain body and its history series."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.api.resources.mig.serializers import LayoutSerializer
from fleet.inventory.models import Gpu
from fleet.inventory.selectors import HISTORY_MAX_POINTS, HISTORY_WINDOWS, latest_telemetry_of


class GpuSerializer(serializers.ModelSerializer[Gpu]):
    host_name = serializers.CharField(source="host.name", read_only=True)
    last_telemetry = serializers.SerializerMethodField()
    last_telemetry_at = serializers.SerializerMethodField()

    def _latest(self, obj: Gpu) -> tuple[dict[str, Any], Any]:
        latest = self.context.get("latest_telemetry")
        if latest is None:
            latest = latest_telemetry_of([obj])
        return latest.get(obj.pk, ({}, None))

    @extend_schema_field(
        serializers.DictField(
            help_text="Latest sample as the agent sent it; null values mean NVML has none."
        )
    )
    def get_last_telemetry(self, obj: Gpu) -> dict[str, Any]:
        return self._latest(obj)[0]

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_last_telemetry_at(self, obj: Gpu) -> str | None:
        at = self._latest(obj)[1]
        return at.isoformat() if at is not None else None

    class Meta:
        model = Gpu
        fields = [
            "id",
            "host",
            "host_name",
            "index",
            "uuid",
            "product_name",
            "product_key",
            "pci_device_id",
            "memory_mib",
            "mig_capable",
            "mig_enabled",
            "mode",
            "health",
            "health_reason",
            "health_cause",
            "health_changed_at",
            "cordoned",
            "auto_cordoned",
            "cordon_reason",
            "observed",
            "last_telemetry",
            "last_telemetry_at",
        ]
        read_only_fields = fields


class DrainSerializer(serializers.Serializer[Any]):
    layout = LayoutSerializer(
        required=False, allow_null=True, help_text="Reshape to this layout once drained."
    )
    timeout_s = serializers.IntegerField(default=300, min_value=5, max_value=86_400)


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
