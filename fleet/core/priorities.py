"""Priority classes: the small ordered set admins define (``critical``, ``production``,
``batch`` by default), the default a team gives its deployments, and each deployment's own.

A higher ``value`` is served first in the queue and yields last within its team; it never lets a
team take another team's deserved share (docs/sharing.md). A deployment or a team names a class;
a class still named by one cannot be deleted (409), and its name never changes (it is the key),
so a name read back always means the same class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.utils.text import slugify

from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.models import OperationKind, OperationStatus, PriorityClass
from fleet.core.operations import operation_record

MAX_CLASSES = 32
MAX_VALUE = 10**6
NO_PRIORITY = 0
"""The value of a deployment whose priority, and its team's default, are empty."""


def priority_checked(name: Any, field: str = "priority") -> str:
    """``name`` if it names a priority class, ``""`` for none; else 400 ``priority.unknown``."""
    if name in (None, ""):
        return ""
    if not isinstance(name, str) or not PriorityClass.objects.filter(name=name).exists():
        raise ServiceError(
            "priority.unknown",
            f"{str(name)[:40]!r} is not a priority class (GET /api/v1/priorities/).",
            {"field": field, "priorities": list(priority_values())},
        )
    return name


def priority_values() -> dict[str, int]:
    """``{name: value}`` of every class, the highest first."""
    return dict(PriorityClass.objects.order_by("-value").values_list("name", "value"))


def effective_priority(own: str, team_default: str) -> str:
    """The class a deployment is served by: its own, else its team's default (``""``: none)."""
    return own or team_default


def _checked_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_VALUE:
        raise ServiceError(
            "priority.invalid",
            f"'value' is a whole number from -{MAX_VALUE} to {MAX_VALUE}.",
            {"field": "value"},
        )
    return int(value)


def _checked_description(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 200:
        raise ServiceError(
            "priority.invalid",
            "'description' is text of 200 characters at most.",
            {"field": "description"},
        )
    return value


def _saved(priority: PriorityClass) -> PriorityClass:
    try:
        with transaction.atomic():
            priority.save()
    except IntegrityError:
        raise Conflict(
            "priority.taken",
            "Another priority class has that name or value: each is unique.",
            {"name": priority.name, "value": priority.value},
        ) from None
    return priority


def priority_audit(summary: str, requested_by: Any, **payload: Any) -> None:
    operation_record(
        kind=OperationKind.TEAM,
        summary=summary,
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        payload={"priority_class": payload},
    )


@transaction.atomic
def priority_class_create(
    *, name: Any, value: Any, description: Any = "", requested_by: Any = None
) -> PriorityClass:
    slug = slugify(name)[:32] if isinstance(name, str) else ""
    if not slug or slug != name:
        raise ServiceError(
            "priority.invalid",
            "'name' is 1 to 32 lower-case letters, digits, '-' or '_'.",
            {"field": "name"},
        )
    if PriorityClass.objects.count() >= MAX_CLASSES:
        raise Conflict("priority.too_many", f"At most {MAX_CLASSES} priority classes.")
    priority = _saved(
        PriorityClass(
            name=slug, value=_checked_value(value), description=_checked_description(description)
        )
    )
    priority_audit(f"Defined priority class {priority}", requested_by, name=slug)
    return priority


def priority_class_get(name: str) -> PriorityClass:
    found = PriorityClass.objects.filter(name=name).first()
    if found is None:
        raise NotFound(
            "priority.not_found", f"No priority class {name[:40]!r}.", {"name": name[:40]}
        )
    return found


@transaction.atomic
def priority_class_update(
    *, name: str, changes: Mapping[str, Any], requested_by: Any = None
) -> PriorityClass:
    """Change a class's ``value`` or ``description`` (its name is its key and stays)."""
    unknown = sorted(set(changes) - {"value", "description"})
    if unknown:
        raise ServiceError(
            "priority.field_unknown",
            f"Only 'value' and 'description' change, not {str(unknown[0])[:40]!r}.",
            {"field": str(unknown[0])[:40]},
        )
    priority = priority_class_get(name)
    if "value" in changes:
        priority.value = _checked_value(changes["value"])
    if "description" in changes:
        priority.description = _checked_description(changes["description"])
    _saved(priority)
    priority_audit(f"Changed priority class {priority}", requested_by, name=name)
    return priority
