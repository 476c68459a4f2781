from __future__ import annotations

from django.contrib import admin

from fleet.partitioning.models import Operation, Partition


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin[Partition]):
    list_display = ("__str__", "kind", "profile_name", "start", "size", "memory_mib", "mps_enabled")
    list_filter = ("kind", "mps_enabled", "profile_name")
    search_fields = ("gpu__uuid", "gpu__host__name", "uuid")


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin[Operation]):
    list_display = (
        "id",
        "kind",
        "status",
        "summary",
        "requested_by",
        "host",
        "created_at",
        "finished_at",
    )
    list_filter = ("kind", "status")
    search_fields = ("summary", "reason", "host__name")
    readonly_fields = [f.name for f in Operation._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False  # operations are the audit trail: written by services only
