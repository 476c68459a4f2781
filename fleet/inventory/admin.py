from __future__ import annotations

from django.contrib import admin

from fleet.inventory.models import Gpu, Host


class GpuInline(admin.TabularInline[Gpu, Host]):
    model = Gpu
    extra = 0
    fields = ("index", "uuid", "product_name", "memory_mib", "mode", "health", "cordoned")
    readonly_fields = fields


@admin.register(Host)
class HostAdmin(admin.ModelAdmin[Host]):
    list_display = (
        "name",
        "status",
        "agent_version",
        "last_seen_at",
        "desired_generation",
        "applied_generation",
    )
    list_filter = ("status",)
    search_fields = ("name", "hostname")
    readonly_fields = (
        "enrollment_token_hash",
        "token_prefix",
        "token_hash",
        "desired_generation",
        "applied_generation",
        "dispatched_generation",
        "dispatched_at",
        "last_seen_at",
    )
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin[Gpu]):
    list_display = ("__str__", "uuid", "mode", "health", "cordoned", "memory_mib")
    list_filter = ("mode", "health", "cordoned", "product_name")
    search_fields = ("uuid", "product_name", "host__name")
