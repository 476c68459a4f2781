from __future__ import annotations

from django.contrib import admin

from fleet.core.admin import ReadOnlyAdmin
from fleet.partitioning.models import Partition


@admin.register(Partition)
class PartitionAdmin(ReadOnlyAdmin, admin.ModelAdmin[Partition]):
    list_display = ("__str__", "kind", "profile_name", "start", "size", "memory_mib", "mps_enabled")
    list_filter = ("kind", "mps_enabled", "profile_name")
    search_fields = ("gpu__uuid", "gpu__host__name", "uuid")
