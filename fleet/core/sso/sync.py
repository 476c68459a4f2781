"""The writes of single sign-on: an identity-provider user's fleet role and team memberships
follow their groups (``FLEET_SSO_GROUP_MAP``) at each sign-in and sync, and a user the
provider no longer knows (or has disabled) loses their API tokens and sessions.

Only SSO users are touched: a local account never has an :class:`SsoIdentity`, and an SSO
sign-in never takes over a local account of the same name (:func:`sso_identity_claim`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.core.events import CLOSE_SIGNED_OUT, publish_user_revoked
from fleet.core.models import (
    ApiToken,
    OperationKind,
    OperationStatus,
    SsoIdentity,
    Team,
    TeamMembership,
)
from fleet.core.operations import operation_record
from fleet.core.roles import GROUP_NAMES
from fleet.core.sso.mapping import Grants, grants_for

logger = logging.getLogger(__name__)

MAX_GROUPS_KEPT = 200


def sso_identity_claim(*, user: Any, source: str, subject: str) -> bool:
    """Whether ``user`` may be signed in as ``source:subject``: a new user, or one already
    bound to that identity. A local account (or another identity's) of the same name is
    refused, so a directory entry cannot take over an admin's local account."""
    if user.pk is None:
        return True
    identity = SsoIdentity.objects.filter(user=user).first()
    return identity is not None and (identity.source, identity.subject) == (source, subject)


@transaction.atomic
def sso_user_sync(*, user: Any, source: str, subject: str, groups: Iterable[str]) -> Grants:
    """Record the identity and make the user's fleet role and mapped team roles those that
    ``groups`` grant; a user disabled by an earlier sync (not by an admin) is enabled again."""
    names = sorted({str(g)[:256] for g in groups})[:MAX_GROUPS_KEPT]
    identity, _ = SsoIdentity.objects.update_or_create(
        user=user,
        defaults={"source": source, "subject": subject, "groups": names},
    )
    identity.synced_at = timezone.now()
    if identity.disabled_at is not None:
        identity.disabled_at = None
        user.is_active = True
        user.save(update_fields=["is_active"])
    identity.save(update_fields=["synced_at", "disabled_at"])
    group_map = settings.FLEET_SSO_GROUP_MAP
    grants = grants_for(names, group_map)
    changes = _role_apply(user, grants.role) + _teams_apply(
        user, grants.teams, group_map.managed_teams
    )
    if changes:
        logger.info("sso: %s (%s) now %s", user.get_username(), source, "; ".join(changes))
        operation_record(
            kind=OperationKind.CHANGE_USER,
            summary=f"Single sign-on set {user.get_username()}'s roles from their groups",
            status=OperationStatus.SUCCEEDED,
            payload={"user": user.pk, "source": source, "changes": changes},
        )
    return grants


def _role_apply(user: Any, role: str | None) -> list[str]:
    held = set(user.groups.filter(name__in=GROUP_NAMES.values()).values_list("name", flat=True))
    wanted = {role} if role else set()
    changes = []
    for name in sorted(held - wanted):
        user.groups.remove(Group.objects.get(name=name))
        changes.append(f"-{name}")
    for name in sorted(wanted - held):
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
        changes.append(f"+{name}")
    user.__dict__.pop("_fleet_role", None)
    return changes


def _teams_apply(user: Any, wanted: Mapping[str, str], managed: frozenset[str]) -> list[str]:
    held = {
        m.team.slug: m
        for m in TeamMembership.objects.filter(user=user, team__slug__in=managed).select_related(
            "team"
        )
    }
    changes = []
    for slug in sorted(managed):
        membership, role = held.get(slug), wanted.get(slug)
        if membership is not None and role is None:
            membership.delete()
            changes.append(f"-team {slug}")
        elif membership is not None and role is not None and membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
            changes.append(f"team {slug}={role}")
        elif membership is None and role is not None:
            team = _team_for(slug)
            if team is not None:
                TeamMembership.objects.create(team=team, user=user, role=role)
                changes.append(f"+team {slug}={role}")
    user.__dict__.pop("_fleet_teams", None)
    return changes


def _team_for(slug: str) -> Team | None:
    """The team of that slug, created (named as its slug) when the map names a new one; None
    when another team already has that name (logged: an admin renames one of them)."""
    try:
        with transaction.atomic():
            team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": slug})
    except IntegrityError:
        logger.warning("sso: team %r not created: another team is named so", slug)
        return None
    return team


@transaction.atomic
def sso_user_revoke(*, user: Any, reason: str, disable: bool) -> int:
    """End what the user holds: their API tokens (deleted), their sessions (the session hash
    changes) and live sockets; ``disable`` also deactivates them until the provider says they
    are back. Returns the number of tokens revoked."""
    revoked, _ = ApiToken.objects.filter(user=user).delete()
    # A new unusable password changes the hash every session carries: each ends at its next
    # request, wherever it is stored.
    user.set_unusable_password()
    fields = ["password"]
    if disable and user.is_active:
        user.is_active = False
        fields.append("is_active")
        SsoIdentity.objects.filter(user=user).update(disabled_at=timezone.now())
    user.save(update_fields=fields)
    user_id = user.pk
    transaction.on_commit(lambda: publish_user_revoked(user_id, CLOSE_SIGNED_OUT))
    operation_record(
        kind=OperationKind.REVOKE_TOKEN,
        summary=f"Single sign-on revoked {user.get_username()}'s access: {reason}"[:255],
        status=OperationStatus.SUCCEEDED,
        payload={"user": user_id, "tokens": revoked, "disabled": disable, "reason": reason},
    )
    logger.info("sso: revoked %s (%d tokens): %s", user.get_username(), revoked, reason)
    return revoked
