"""The deployments tray: each card with what fits now of its unplaced replicas, and where.

The engine answers for every deployment of the tray on one fleet snapshot
(:func:`fleet.allocations.rankings.deployments_fit_now`); this module says its best target in
words (host / GPU / slice) and its main refusal, for the first render and every tray fragment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from django.http import HttpRequest

from fleet.allocations.models import Deployment, RequestKind
from fleet.allocations.quotas import quota_refusals
from fleet.allocations.rankings import FitNow, deployments_fit_now
from fleet.allocations.states import replica_counts
from fleet.core.models import Team
from fleet.core.roles import Role, role_of
from fleet.core.teams import operated_teams
from fleet.inventory.models import Gpu
from fleet.partitioning import converters
from fleet.partitioning.models import Partition, PartitionKind
from fleet.placement import Target
from fleet.web import selectors
from fleet.web.presenters import DeploymentCard, TrayFit, deployment_card, tray_sections
from fleet.web.reasons import GPU_ID, reason_sentence


def tray_context(request: HttpRequest) -> dict[str, Any]:
    """The tray's cards, of one team when ``?team=`` names its slug, and the teams to pick
    (``deploy_teams``: slug, name and id of those the user may deploy for)."""
    team = request.GET.get("team", "").strip()[:100]
    teams = Team.objects.order_by("name")
    own = (
        teams
        if role_of(request.user) >= Role.OPERATOR
        else teams.filter(pk__in=operated_teams(request.user))
    )
    cards = tray_cards(team=team)
    return {
        "deployments": cards,
        "tray_sections": tray_sections(cards),
        "tray_team": team,
        "teams": list(teams.values_list("slug", "name")),
        "deploy_teams": list(own.values_list("slug", "name", "pk")),
    }


def tray_cards(team: str = "") -> list[DeploymentCard]:
    """Every deployment's card (of the team whose slug is ``team``, when given); those with
    unplaced replicas say what fits now, or that their team's quota refuses them."""
    queryset = selectors.tray_deployments()
    if team:
        queryset = queryset.filter(team__slug=team)
    deployments = list(queryset)
    cards = [deployment_card(d) for d in deployments]
    fits = deployment_fits(
        (d, card.replicas - card.placed)
        for d, card in zip(deployments, cards, strict=True)
        if card.placeable
    )
    return [replace(card, fit=fits[card.id]) if card.id in fits else card for card in cards]


def unplaced_fits(deployments: Iterable[Deployment]) -> dict[int, TrayFit]:
    """:func:`deployment_fits` of the deployments (allocations prefetched) with replicas not
    placed, those being deleted left out."""
    return deployment_fits(
        (d, d.replicas - replica_counts(d)[0]) for d in deployments if not d.deleting
    )


def deployment_fits(wanted: Iterable[tuple[Deployment, int]]) -> dict[int, TrayFit]:
    """For ``(deployment, unplaced)`` pairs, what fits now of each one's unplaced replicas,
    where the next one goes (in words), or the main reason none does (the team's quota first):
    one fleet snapshot for all."""
    wanted = [(d, n) for d, n in wanted if n > 0]
    over_quota = quota_refusals(d for d, _ in wanted)
    fits = deployments_fit_now([(d, n) for d, n in wanted if d.pk not in over_quota])
    fits_or_quota: dict[int, FitNow | TrayFit] = {**fits}
    for deployment, unplaced in wanted:
        if deployment.pk in over_quota:
            first = over_quota[deployment.pk][0]
            fits_or_quota[deployment.pk] = TrayFit(
                unplaced, 0, reason_code=first.code, reason=first.message
            )
    best = [f.best for f in fits.values() if f.best is not None]
    named = {int(i) for f in fits.values() for v, _ in f.reasons for i in GPU_ID.findall(v.message)}
    gpus, partitions = selectors.target_rows(
        gpu_ids={g for t in best for g in (t.gpu_ids or (t.gpu_id,))} | named,
        partition_ids={t.partition_id for t in best if t.partition_id is not None},
    )
    kinds = {d.pk: d.kind for d, _ in wanted}
    return {pk: _fit(fit, kinds[pk], gpus, partitions) for pk, fit in fits_or_quota.items()}


def _fit(
    fit: FitNow | TrayFit, kind: str, gpus: Mapping[int, Gpu], partitions: Mapping[int, Partition]
) -> TrayFit:
    return fit if isinstance(fit, TrayFit) else tray_fit(fit, kind, gpus, partitions)


def tray_fit(
    fit: FitNow, kind: str, gpus: Mapping[int, Gpu], partitions: Mapping[int, Partition]
) -> TrayFit:
    if fit.best is None:
        if not fit.reasons:
            return TrayFit(fit.unplaced, 0, reason="No GPU in the fleet can take it.")
        violation, refusals = fit.reasons[0]
        reason = reason_sentence(
            violation.code,
            violation.message,
            violation.details,
            lambda pk: gpu_name(gpus[pk]) if pk in gpus else None,
            gpus=refusals,
        )
        return TrayFit(
            fit.unplaced, 0, reason_code=violation.code, reason=reason, refusals=refusals
        )
    where = target_words(fit.best, kind, gpus, partitions)
    return TrayFit(fit.unplaced, fit.fits, fit.capped, best=where)


def gpu_name(gpu: Gpu) -> str:
    """A GPU as every page names it: ``a100-b01/gpu0`` (its host's name and its index)."""
    return f"{gpu.host.name}/gpu{gpu.index}"


def target_words(
    target: Target, kind: str, gpus: Mapping[int, Gpu], partitions: Mapping[int, Partition]
) -> str:
    """A target as the cards name things: ``h100-a01/gpu3 · 1g.10gb@2 (free slice)``."""
    gpu = gpus.get(target.gpu_id)
    if gpu is None:
        return "a GPU no longer in the fleet"
    where = gpu_name(gpu)
    if kind == RequestKind.GPU:
        others = [gpus[g].index for g in target.gpu_ids[1:] if g in gpus]
        listed = "".join(f"+gpu{index}" for index in others)
        return f"{where}{listed} (whole GPU{'s' if others else ''})"
    if target.new_instance is not None:
        product = converters.product_of(gpu)
        profile = product.profile(target.new_instance.profile_id) if product else None
        name = profile.name if profile is not None else f"profile {target.new_instance.profile_id}"
        return f"{where} · new {name}@{target.new_instance.start}"
    partition = partitions.get(target.partition_id) if target.partition_id is not None else None
    if partition is None:
        return where
    if partition.kind != PartitionKind.MIG:
        return f"{where} · MPS share"
    slot = f"{partition.profile_name}@{partition.start}"
    if kind == RequestKind.MPS:
        return f"{where} · MPS in {slot}"
    return f"{where} · {slot} (free slice)"
