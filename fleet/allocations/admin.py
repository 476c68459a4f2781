from __future__ import annotations

from django.contrib import admin

from fleet.allocations.models import Allocation, Deployment
from fleet.core.admin import ReadOnlyAdmin


class AllocationInline(ReadOnlyAdmin, admin.TabularInline[Allocation, Deployment]):
    model = Allocation
    extra = 0
    fields = ("replica", "gpu_slot", "gpu", "partition", "memory_mib", "compute_percent", "state")
    readonly_fields = fields


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin, admin.ModelAdmin[Deployment]):
    """Shown, never changed here: creating, resizing, scaling and deleting a deployment go
    through its services (the API and the dashboard), which check quotas and capacity and tell
    the agents. A row edited or deleted here would free capacity its replicas still hold."""

    list_display = (
        "name",
        "kind",
        "profile",
        "memory_mib",
        "max_compute_percent",
        "gpu_count",
        "replicas",
    )
    list_filter = ("kind",)
    search_fields = ("name", "profile")
    inlines = [AllocationInline]


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin, admin.ModelAdmin[Allocation]):
    list_display = ("__str__", "kind", "gpu", "memory_mib", "compute_percent", "state")
    list_filter = ("kind", "state")
