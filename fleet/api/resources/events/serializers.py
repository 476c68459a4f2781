"""Health events, as agents reported them."""

from __future__ import annotations

from rest_framework import serializers

from fleet.inventory.models import HealthEvent


class HealthEventSerializer(serializers.ModelSerializer[HealthEvent]):
    class Meta:
        model = HealthEvent
        fields = ["id", "host", "gpu", "kind", "xid", "gpu_instance_id", "detail", "ts"]
        read_only_fields = fields
