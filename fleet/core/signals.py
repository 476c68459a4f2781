"""Receivers that keep access in step with the user: failed sign-ins are counted and recorded;
a sign-out, a deactivation or the loss of every role closes the user's live sockets.

Connected by :meth:`fleet.core.apps.CoreConfig.ready`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.actions import delete_selected
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from fleet.core import login_throttle
from fleet.core.events import (
    CLOSE_NO_ROLE,
    CLOSE_SIGNED_OUT,
    publish_user_revoked,
    session_fingerprint,
)
from fleet.core.http import client_address
from fleet.core.models import OperationKind, OperationStatus, TeamMembership
from fleet.core.operations import operation_record
from fleet.core.roles import Role, role_of
from fleet.core.services import login_failure_record


def connect() -> None:
    post_save.connect(_admin_logged, sender=LogEntry, dispatch_uid="fleet.admin_logged")
    user_model = get_user_model()
    user_login_failed.connect(_login_failed, dispatch_uid="fleet.login_failed")
    user_logged_in.connect(_logged_in, dispatch_uid="fleet.logged_in")
    user_logged_out.connect(_logged_out, dispatch_uid="fleet.logged_out")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="fleet.user_saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="fleet.user_deleted")
    m2m_changed.connect(
        _groups_changed, sender=user_model.groups.through, dispatch_uid="fleet.groups_changed"
    )
    # A team member without a fleet role sees the fleet as a viewer: leaving the last team can
    # take every role away.
    post_delete.connect(_membership_deleted, sender=TeamMembership, dispatch_uid="fleet.left_team")


def _login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any) -> None:
    username = str(credentials.get(get_user_model().USERNAME_FIELD) or "")
    address = client_address(request) if request is not None else ""
    login_failure_record(username=username, address=address)


def _logged_in(sender: Any, request: Any, user: Any, **_: Any) -> None:
    login_throttle.forget(username=user.get_username())


def _logged_out(sender: Any, request: Any, user: Any, **_: Any) -> None:
    if user is None:
        return
    # Sent before the session is flushed: its key still names the sockets it opened.
    key = getattr(getattr(request, "session", None), "session_key", None)
    publish_user_revoked(user.pk, CLOSE_SIGNED_OUT, session_fingerprint(key) if key else "")


def _user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return  # a new user has no socket; signing in only stamps last_login
    _check_after_commit(instance.pk)


def _membership_deleted(sender: Any, instance: TeamMembership, **_: Any) -> None:
    _check_after_commit(instance.user_id)


def _user_deleted(sender: Any, instance: Any, **_: Any) -> None:
    user_id = instance.pk
    transaction.on_commit(lambda: publish_user_revoked(user_id, CLOSE_SIGNED_OUT))


def _groups_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: set[int] | None, **_: Any
) -> None:
    if not reverse:  # user.groups.remove / clear / set
        if action in ("post_remove", "post_clear"):
            _check_after_commit(instance.pk)
    elif action == "pre_clear":  # group.user_set.clear(): remember who was in it
        instance._fleet_cleared_ids = list(instance.user_set.values_list("pk", flat=True))
    elif action in ("post_remove", "post_clear"):
        ids = pk_set if action == "post_remove" else instance.__dict__.pop("_fleet_cleared_ids", [])
        for user_id in ids or ():
            _check_after_commit(user_id)


def _check_after_commit(user_id: int) -> None:
    # After commit: ``groups.set()`` removes before it adds, and the admin saves the user before
    # its groups; only the committed state says whether access was really lost.
    transaction.on_commit(lambda: _close_if_access_lost(user_id))


def _close_if_access_lost(user_id: int) -> None:
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or not user.is_active:
        publish_user_revoked(user_id, CLOSE_SIGNED_OUT)
    elif role_of(user) is Role.NONE:
        publish_user_revoked(user_id, CLOSE_NO_ROLE)


ADMIN_VERBS = {ADDITION: "added", CHANGE: "changed", DELETION: "deleted"}


def _admin_logged(sender: Any, instance: LogEntry, created: bool, **_: Any) -> None:
    """Every change made in the Django admin joins the operations feed, with who made it."""
    if not created:
        return
    verb = ADMIN_VERBS.get(instance.action_flag, "changed")
    content_type = (
        ContentType.objects.get_for_id(instance.content_type_id)
        if instance.content_type_id
        else None
    )
    model = content_type.model if content_type is not None else "object"
    label = f"{content_type.app_label}.{model}" if content_type is not None else ""
    message = instance.get_change_message()
    operation_record(
        kind=OperationKind.ADMIN_CHANGE,
        summary=f"Admin {verb} {model} {instance.object_repr}"
        + (f": {message}" if message else ""),
        requested_by=instance.user,
        status=OperationStatus.SUCCEEDED,
        payload={
            "model": label,
            "object_id": instance.object_id,
            "action": verb,
            "change": message[:1000],
        },
    )


def audited_delete_selected(modeladmin: Any, request: Any, queryset: Any) -> Any:
    """Django's "delete selected" action, recorded as one operation once confirmed and done.

    One row deleted is logged by the admin with a save, which :func:`_admin_logged` records;
    several are logged with a bulk insert (no signal): those are recorded here."""
    confirmed = bool(request.POST.get("post"))
    doomed = [str(obj) for obj in queryset[:50]] if confirmed else []
    count = queryset.count() if confirmed else 0
    response = delete_selected(modeladmin, request, queryset)
    if confirmed and response is None and count > 1:  # None: deleted (a page: not yet or not)
        model = queryset.model._meta.verbose_name_plural
        operation_record(
            kind=OperationKind.ADMIN_CHANGE,
            summary=f"Admin deleted {count} {model}: {', '.join(doomed)}",
            requested_by=request.user,
            status=OperationStatus.SUCCEEDED,
            payload={
                "model": queryset.model._meta.label_lower,
                "deleted": count,
                "action": "deleted",
            },
        )
    return response


audited_delete_selected.short_description = delete_selected.short_description  # type: ignore[attr-defined]
audited_delete_selected.allowed_permissions = ("delete",)  # type: ignore[attr-defined]
