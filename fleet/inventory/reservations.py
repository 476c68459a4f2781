"""A host reserved for some teams: the placement engine puts only their deployments' replicas on
it (rule ``placement.host_reserved``), as a Kubernetes taint keeps off every pod without the
matching toleration. No reservation (the default): every team's replicas may go there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from fleet.core.errors import NotFound, ServiceError
from fleet.core.events import publish_changed
from fleet.core.filters import ID_MAX
from fleet.core.models import OperationKind, OperationStatus, Team
from fleet.core.operations import operation_record
from fleet.inventory.models import Host

MAX_RESERVED_TEAMS = 64
"""Teams one host may be reserved for at most (the body is refused past it, before any read)."""

TeamRef = int | str
"""A team as a request names it: its id, or its slug."""


def reserved_slugs(host: Host) -> list[str]:
    """The slugs of the teams the host is reserved for, sorted (``[]``: none)."""
    return sorted(team.slug for team in host.reserved_for.all())


@transaction.atomic
def host_set_reservation(
    *, host_id: int, teams: Sequence[TeamRef], requested_by: Any = None
) -> Host:
    """Reserve the host for exactly ``teams`` (ids or slugs); ``[]`` lifts the reservation.

    From now on the engine places on it only replicas of those teams' deployments, on every
    path (place, auto-placement, scale, moves, drains, re-placement, repack, defrag). Replicas
    already there stay, whatever their team: nothing is evicted. Recorded as a
    ``reserve_host`` operation (unless nothing changes) and told to browsers.

    The host's row lock orders it with placements on the host, which read the reservation in
    their snapshot under that same lock.

    Raises:
        ServiceError: ``reservation.invalid`` (400) for a body that is not a list of ids and
            slugs, or lists more than :data:`MAX_RESERVED_TEAMS`; ``team.not_found`` (400) for
            a team that does not exist (``details.teams``: those not found).
        NotFound: ``host.not_found``.
    """
    wanted = _checked(teams)
    host = Host.objects.select_for_update().filter(pk=host_id).first()
    if host is None:
        raise NotFound("host.not_found", f"Host {host_id} does not exist.", {"host": host_id})
    found = _teams(wanted)
    before = reserved_slugs(host)
    after = sorted(team.slug for team in found)
    if before == after:
        return host
    host.reserved_for.set(found)
    Host.objects.filter(pk=host.pk).update(updated_at=timezone.now())
    operation_record(
        kind=OperationKind.RESERVE_HOST,
        summary=f"Reserved {host.name} for {', '.join(after)}"
        if after
        else f"Reservation of {host.name} lifted",
        requested_by=requested_by,
        host=host,
        status=OperationStatus.SUCCEEDED,
        payload={"before": before, "after": after, "teams": sorted(t.pk for t in found)},
    )
    publish_changed("host", [host.pk])
    return host


def _checked(teams: Any) -> list[TeamRef]:
    if not isinstance(teams, list | tuple):
        raise ServiceError(
            "reservation.invalid", "'teams' must be a list of team ids or slugs.", {}
        )
    if len(teams) > MAX_RESERVED_TEAMS:
        raise ServiceError(
            "reservation.invalid",
            f"A host can be reserved for at most {MAX_RESERVED_TEAMS} teams.",
            {"max": MAX_RESERVED_TEAMS},
        )
    checked: list[TeamRef] = []
    for team in teams:
        if isinstance(team, bool) or not isinstance(team, int | str) or "\x00" in str(team):
            raise ServiceError(
                "reservation.invalid", "Each team is an id or a slug.", {"team": repr(team)[:40]}
            )
        checked.append(team)
    return checked


def _teams(wanted: list[TeamRef]) -> list[Team]:
    """The teams named, each once; every one must exist."""
    ids = {ref for ref in wanted if isinstance(ref, int)}
    slugs: set[str] = set()
    for ref in wanted:
        if isinstance(ref, str):
            text = ref.strip()
            # As the deployment endpoints read a team: digits are an id, anything else a slug.
            if text.isdecimal() and len(text) <= 18:
                ids.add(int(text))
            else:
                slugs.add(text)
    by_id = {t.pk: t for t in Team.objects.filter(pk__in=[i for i in ids if 1 <= i <= ID_MAX])}
    by_slug = {t.slug: t for t in Team.objects.filter(slug__in=slugs)}
    missing = [str(i) for i in sorted(ids) if i not in by_id]
    missing += sorted(s for s in slugs if s not in by_slug)
    if missing:
        shown = ", ".join(missing[:5])
        raise ServiceError(
            "team.not_found",
            f"No such team: {shown}.",
            {"teams": [m[:100] for m in missing[:20]]},
        )
    return list({t.pk: t for t in [*by_id.values(), *by_slug.values()]}.values())
