"""A deployment's details: the fields listed in ``Deployment.DETAIL_FIELDS``, which people read
and nothing places, runs, bounds or bills by (a description, say). They are given at creation or
changed at any time, in place, by the same service, with the model's own bounds; no replica,
generation or quota is touched, so no operation is recorded (as for a row's cosmetic fields in
the Django admin), and browsers are told the deployment changed.

Adding such a field is the path in ``docs/architecture.md`` (*Adding a field to Deployment*)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.allocations.models import Deployment
from fleet.allocations.services import lock_deployment
from fleet.core.errors import ServiceError
from fleet.core.events import publish_changed
from fleet.core.priorities import priority_checked


@transaction.atomic
def deployment_set_details(*, deployment_id: int, details: Mapping[str, Any]) -> Deployment:
    """Set the given detail fields of the deployment (those left out stay).

    Raises:
        NotFound: ``deployment.not_found``.
        Conflict: ``deployment.deleting``.
        ServiceError: ``deployment.field_unknown`` (not a detail field), ``priority.unknown``
            (``priority`` names no priority class),
            ``deployment.detail_invalid`` (past the model's bounds; ``details.fields`` says why).
    """
    unknown = sorted(str(name)[:64] for name in details if name not in Deployment.DETAIL_FIELDS)
    if unknown:
        raise ServiceError(
            "deployment.field_unknown",
            f"{unknown[0]!r} is not a detail of a deployment.",
            {"fields": unknown[:8], "details": list(Deployment.DETAIL_FIELDS)},
        )
    if "priority" in details:
        details = {**details, "priority": priority_checked(details["priority"])}
    deployment = lock_deployment(deployment_id)
    for name, value in details.items():
        setattr(deployment, name, value)
    others = [f.name for f in Deployment._meta.fields if f.name not in details]
    try:
        deployment.clean_fields(exclude=others)
    except ValidationError as error:
        raise ServiceError(
            "deployment.detail_invalid",
            "A detail of the deployment is not valid.",
            {"fields": {k: [str(m) for m in v] for k, v in error.message_dict.items()}},
        ) from None
    if details:
        deployment.save(update_fields=list(details))
        publish_changed("deployment", [deployment.pk])
    return deployment
