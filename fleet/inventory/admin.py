from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from fleet.core.admin import ReadOnlyAdmin
from fleet.inventory.labels import labels_problems
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_issue_enrollment, host_revoke_token


class GpuInline(admin.TabularInline[Gpu, Host]):
    model = Gpu
    extra = 0
    fields = ("index", "uuid", "product_name", "memory_mib", "mode", "health", "cordoned")
    readonly_fields = fields


HOST_FIELDS = (
    "name",
    "labels",
    "status",
    "hostname",
    "agent_version",
    "driver_version",
    "last_seen_at",
    "desired_generation",
    "applied_generation",
)


class HostAdminForm(forms.ModelForm[Host]):
    """The admin's host form: labels bounded as the API bounds them."""

    class Meta:
        model = Host
        fields = HOST_FIELDS

    def clean_labels(self) -> Any:
        labels = self.cleaned_data.get("labels") or {}
        problems = labels_problems(labels)
        if problems:
            raise forms.ValidationError(problems[:5])
        return labels


@admin.register(Host)
class HostAdmin(admin.ModelAdmin[Host]):
    form = HostAdminForm
    actions = ["issue_enrollment_token", "revoke_agent_token"]
    fields = HOST_FIELDS

    def save_model(self, request: HttpRequest, obj: Host, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            self._show_token(request, obj, host_issue_enrollment(obj))

    @admin.action(description="Issue a new enrollment token (shown once)")
    def issue_enrollment_token(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        for host in queryset:
            self._show_token(request, host, host_issue_enrollment(host))

    @admin.action(description="Revoke the agent token (closes its connections now)")
    def revoke_agent_token(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        for host in queryset:
            host_revoke_token(host_id=host.pk, requested_by=request.user)
        messages.success(request, f"Revoked the agent token of {queryset.count()} host(s).")

    def _show_token(self, request: HttpRequest, host: Host, token: str) -> None:
        messages.warning(
            request,
            f"Enrollment token for {host.name} (shown once, valid 7 days): {token} — run "
            f"fleet-agent --server <URL> --enroll {token} on the host.",
        )

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
    # The status changes only through its services (cordon, drain, maintenance; an agent's
    # messages and the offline sweep), which move or keep the replicas accordingly.
    readonly_fields = (
        "status",
        "hostname",
        "agent_version",
        "driver_version",
        "desired_generation",
        "applied_generation",
        "dispatched_generation",
        "dispatched_at",
        "last_seen_at",
    )
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(ReadOnlyAdmin, admin.ModelAdmin[Gpu]):
    """Agents report GPUs; cordons, layouts and health go through their services (the API and
    the dashboard), which keep what is placed on a GPU within what it has."""

    list_display = ("__str__", "uuid", "mode", "health", "cordoned", "memory_mib")
    list_filter = ("mode", "health", "cordoned", "product_name")
    search_fields = ("uuid", "product_name", "host__name")
