"""The writes on team secrets: create, set a new value (optionally rolling every deployment of
the team that refers to it), delete.

They live on this floor because they must know the deployments that refer to a secret (a
reference in a deployment's workload, or in one of its replicas' copies during a rolling
update); the encryption and the references themselves are :mod:`fleet.core.secrets`. Each write
is audited as a ``set_secret`` or ``delete_secret`` operation naming the secret and its version,
never its value.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.models import Allocation, Deployment
from fleet.core.errors import Conflict, NotFound, ServiceError
from fleet.core.models import OperationKind, OperationStatus, Team, TeamSecret
from fleet.core.operations import operation_record
from fleet.core.secrets import (
    MAX_SECRETS_PER_TEAM,
    secret_encrypt,
    secret_name_checked,
    secret_value_checked,
    workload_refs,
)
from fleet.core.teams import lock_team

logger = logging.getLogger(__name__)


@dataclass
class SecretRoll:
    """The rolling updates started for a secret's new value: the ``rollout`` operation of each
    deployment that refers to it, and why the others were not rolled."""

    rollouts: dict[int, int] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)


def deployments_referring(team_id: int, name: str) -> list[Deployment]:
    """The team's deployments whose workload, or a replica copy's, refers to secret ``name``."""
    found = []
    for deployment in Deployment.objects.filter(team_id=team_id).order_by("pk"):
        copies = Allocation.objects.filter(deployment=deployment, workload__isnull=False)
        workloads = [deployment.workload, *copies.values_list("workload", flat=True)]
        if any(name in workload_refs(w).values() for w in workloads):
            found.append(deployment)
    return found


def _audit(
    kind: str, summary: str, team: Team, secret: TeamSecret, requested_by: Any, **extra: Any
) -> None:
    operation_record(
        kind=kind,
        summary=summary,
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        payload={"team": team.pk, "name": secret.name, "version": secret.version, **extra},
    )


def _team(team_id: int) -> Team:
    team = Team.objects.filter(pk=team_id).first()
    if team is None:
        raise NotFound("team.not_found", f"Team {team_id} does not exist.", {"team": team_id})
    return team


def _secret(team: Team, name: Any) -> TeamSecret:
    found = TeamSecret.objects.select_for_update().filter(team=team, name=name).first()
    if found is None:
        raise NotFound(
            "secret.not_found",
            f"Team {team.name} has no secret {str(name)[:100]!r}.",
            {"team": team.pk, "name": str(name)[:100]},
        )
    return found


@transaction.atomic
def team_secret_create(
    *, team_id: int, name: Any, value: Any, requested_by: Any = None
) -> TeamSecret:
    """A new secret of the team, version 1 (409 ``secret.exists`` when the name is taken)."""
    checked_name = secret_name_checked(name)
    checked_value = secret_value_checked(value)
    team = lock_team(team_id)
    if TeamSecret.objects.filter(team=team, name=checked_name).exists():
        raise Conflict(
            "secret.exists",
            f"Team {team.name} already has a secret {checked_name!r}: PUT a new value.",
            {"team": team.pk, "name": checked_name},
        )
    if TeamSecret.objects.filter(team=team).count() >= MAX_SECRETS_PER_TEAM:
        raise Conflict(
            "secret.too_many",
            f"A team holds {MAX_SECRETS_PER_TEAM} secrets at most.",
            {"team": team.pk, "max": MAX_SECRETS_PER_TEAM},
        )
    updated_by = requested_by if getattr(requested_by, "is_authenticated", False) else None
    try:
        with transaction.atomic():
            secret = TeamSecret.objects.create(
                team=team,
                name=checked_name,
                ciphertext=secret_encrypt(checked_value),
                updated_by=updated_by,
            )
    except IntegrityError:
        raise Conflict(
            "secret.exists", f"Team {team.name} already has a secret {checked_name!r}."
        ) from None
    _audit(
        OperationKind.SET_SECRET,
        f"Created secret {checked_name} of team {team.name}",
        team,
        secret,
        requested_by,
    )
    return secret


@transaction.atomic
def team_secret_set(*, team_id: int, name: Any, value: Any, requested_by: Any = None) -> TeamSecret:
    """A new value (the next version). Replicas already running keep the value they started
    with; new copies and restarts get the new one (:func:`team_secret_roll` gets it to all)."""
    checked_value = secret_value_checked(value)
    # Only the secret's row is locked (every other write locks a deployment, then its team,
    # then the secrets it refers to).
    team = _team(team_id)
    secret = _secret(team, name)
    secret.ciphertext = secret_encrypt(checked_value)
    secret.version += 1
    secret.updated_by = requested_by if getattr(requested_by, "is_authenticated", False) else None
    secret.save(update_fields=["ciphertext", "version", "updated_by", "updated_at"])
    _audit(
        OperationKind.SET_SECRET,
        f"Set secret {secret.name} of team {team.name} (version {secret.version})",
        team,
        secret,
        requested_by,
    )
    return secret


def team_secret_roll(*, team_id: int, name: str, requested_by: Any = None) -> SecretRoll:
    """Start a rolling update of every deployment of the team that refers to secret ``name``
    (:func:`~fleet.allocations.deployment_rollouts.deployment_rollout_start` with ``restart``:
    the same workload, new copies that start with the secret's current value). Each is its own
    transaction, after the new value was committed; one that cannot roll now (a rollout runs,
    its team's policy refuses it) is skipped and said why."""
    result = SecretRoll()
    for deployment in deployments_referring(team_id, name):
        try:
            operation = deployment_rollout_start(
                deployment_id=deployment.pk,
                workload=deployment.workload,
                restart=True,
                requested_by=requested_by,
            )
        except ServiceError as error:
            result.skipped[deployment.pk] = error.message
            continue
        result.rollouts[deployment.pk] = operation.pk
    return result


@transaction.atomic
def team_secret_delete(*, team_id: int, name: Any, requested_by: Any = None) -> None:
    """Delete a secret no deployment refers to (409 ``secret.in_use`` naming them). The
    secret's row lock comes first: a deployment being created with a reference to it (which
    locks the row too, :func:`fleet.core.secrets.secrets_enforce`) is seen, or waits."""
    team = lock_team(team_id)
    secret = _secret(team, name)
    users = deployments_referring(team.pk, secret.name)
    if users:
        raise Conflict(
            "secret.in_use",
            f"Secret {secret.name} is used by {', '.join(d.name for d in users[:5])}"
            + (" and others" if len(users) > 5 else "")
            + ": change their workloads first.",
            {"deployments": [d.pk for d in users[:100]]},
        )
    secret.delete()
    _audit(
        OperationKind.DELETE_SECRET,
        f"Deleted secret {secret.name} of team {team.name}",
        team,
        secret,
        requested_by,
    )
