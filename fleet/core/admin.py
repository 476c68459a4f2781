from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from fleet.core.forms import ThrottledAdminAuthenticationForm
from fleet.core.models import (
    AlertDelivery,
    AlertWebhook,
    ApiToken,
    LoginFailure,
    Operation,
    SsoIdentity,
)
from fleet.core.signals import audited_delete_selected

# The admin's sign-in counts failures and locks out like the dashboard's (fleet.core.forms).
admin.site.login_form = ThrottledAdminAuthenticationForm
# Deleting several rows at once is recorded in the operations feed as one admin change (the
# admin logs it with a bulk insert, which sends no signal).
admin.site.add_action(audited_delete_selected, "delete_selected")


class ReadOnlyAdmin:
    """For the audit trail and the rows only services may write (operations, allocations,
    partitions): the admin shows them and changes nothing, so the trail stays append-only and
    the desired state cannot drift from what an agent was told."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    # Tokens issued before the prefix fix show an empty prefix: the id and times tell them apart.
    list_display = ("id", "name", "user", "prefix", "created_at", "expires_at", "last_used_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
    search_fields = ("name", "user__username", "prefix")
    list_filter = ("created_at", "expires_at")


@admin.register(LoginFailure)
class LoginFailureAdmin(admin.ModelAdmin[LoginFailure]):
    """Read-only: failed sign-ins are evidence, written only by the sign-in forms."""

    list_display = ("at", "username", "address")
    list_filter = ("at",)
    search_fields = ("username", "address")
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin, admin.ModelAdmin[Operation]):
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


@admin.register(AlertWebhook)
class AlertWebhookAdmin(ReadOnlyAdmin, admin.ModelAdmin[AlertWebhook]):
    """Configured through the API (validated there; the URL and the secret are write-only)."""

    list_display = ("id", "url", "format", "enabled", "created_at")
    exclude = ("url_ciphertext", "secret_ciphertext")
    list_filter = ("format", "enabled")


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin, admin.ModelAdmin[AlertDelivery]):
    list_display = ("id", "event", "webhook", "status", "attempts", "response_code", "created_at")
    list_filter = ("status", "event")


@admin.register(SsoIdentity)
class SsoIdentityAdmin(ReadOnlyAdmin, admin.ModelAdmin[SsoIdentity]):
    """Written by single sign-on (fleet.core.sso): who signs in from where, with which groups."""

    list_display = ("user", "source", "subject", "synced_at", "disabled_at")
    list_filter = ("source",)
    search_fields = ("user__username", "subject")
    readonly_fields = [f.name for f in SsoIdentity._meta.fields]
