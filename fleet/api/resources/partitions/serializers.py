"""Partitions: MIG instances and whole-GPU partitions."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.partitioning.models import Partition


class PartitionSerializer(serializers.ModelSerializer[Partition]):
    allocated = serializers.SerializerMethodField()

    class Meta:
        model = Partition
        fields = [
            "id",
            "gpu",
            "kind",
            "profile_id",
            "profile_name",
            "start",
            "size",
            "compute_slices",
            "memory_mib",
            "mps_enabled",
            "mps_default_active_thread_percentage",
            "mps_default_pinned_mem_limit_mib",
            "mps_max_clients",
            "uuid",
            "allocated",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(help_text="Allocations bound to this partition."))
    def get_allocated(self, obj: Partition) -> int:
        return len(obj.allocations.all())
