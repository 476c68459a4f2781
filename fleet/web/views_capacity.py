"""The capacity page (/capacity/): what fits now and after reshaping idle MIG instances, MPS and
whole-GPU room, fragmentation per host, and a "what would fit" form that asks the REST API
(``GET /api/v1/capacity/?kind=…``), and a repack proposal with its Apply
(``/api/v1/capacity/repack``, ``static/web/repack.js``). Its panel is re-rendered by the server
after a change."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.allocations.planning.advice import waiting_replica_count
from fleet.allocations.planning.capacity import CapacityPayload, ProductPayload, fleet_capacity
from fleet.allocations.states import DeploymentStatus, deployment_statuses
from fleet.core.roles import Role
from fleet.mig import product_by_key
from fleet.web import selectors
from fleet.web.access import role_required
from fleet.web.views import page_context


@dataclass(frozen=True)
class ProfileBar:
    """One MIG profile's row: the counts, and bar widths relative to the product's largest."""

    profile: str
    fits_now: int
    fits_if_idle_reshaped: int
    now_percent: int
    reshaped_percent: int


def _profile_bars(product: ProductPayload) -> list[ProfileBar]:
    profiles = product["mig"]["profiles"]
    top = max((p["fits_if_idle_reshaped"] for p in profiles), default=0) or 1
    return [
        ProfileBar(
            p["profile"],
            p["fits_now"],
            p["fits_if_idle_reshaped"],
            round(100 * p["fits_now"] / top),
            round(100 * p["fits_if_idle_reshaped"] / top),
        )
        for p in profiles
    ]


def panel_context(payload: CapacityPayload) -> dict[str, Any]:
    """What the panel shows: per product its profiles as bars, and the host heat strip."""
    products = [{**p, "bars": _profile_bars(p)} for p in payload["products"]]
    fragmentation = payload["fragmentation"]
    hosts = [{**h, "heat": round(10 * h["score"])} for h in fragmentation["hosts"]]
    return {
        "products": products,
        "fragmentation": fragmentation,
        "hosts": hosts,
        "score_percent": round(100 * fragmentation["score"]),
    }


def _profile_choices(payload: CapacityPayload) -> list[str]:
    """The MIG profiles the fleet's products offer, for the form (largest first, no repeats)."""
    names: list[str] = []
    for product in payload["products"]:
        catalog = product_by_key(product["product_key"]) if product["product_key"] else None
        listed = [p.name for p in catalog.profiles] if catalog and catalog.mig_capable else []
        names.extend(n for n in listed if n not in names)
    return names


def _advice_products(payload: CapacityPayload) -> list[dict[str, str]]:
    """The MIG products with schedulable GPUs: the layout advisor's choices."""
    found = []
    for product in payload["products"]:
        catalog = product_by_key(product["product_key"]) if product["product_key"] else None
        if catalog is not None and catalog.mig_capable and product["schedulable_gpus"]:
            found.append({"key": catalog.key, "name": product["product"]})
    return found


def status_counts() -> list[dict[str, Any]]:
    """How many live deployments have each status, in the words the tray and the API use."""
    live = selectors.tray_deployments().filter(deleting=False)
    found = Counter(deployment_statuses(live).values())
    return [{"status": s.value, "label": s.label, "count": found[s]} for s in DeploymentStatus]


@role_required(Role.MEMBER)
def capacity(request: HttpRequest) -> HttpResponse:
    """What fits now, what would fit after a reshape, and what is stranded; when replicas wait,
    the layout advisor (asked from the page: the solver takes seconds)."""
    payload = fleet_capacity()
    context = {
        **page_context(request, "capacity"),
        **panel_context(payload),
        "profile_choices": _profile_choices(payload),
        "repack_products": [p for p in payload["products"] if p["product_key"]],
        "waiting_replicas": waiting_replica_count(),
        "status_counts": status_counts(),
        "advice_products": _advice_products(payload),
    }
    return render(request, "web/capacity.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def capacity_panel(request: HttpRequest) -> HttpResponse:
    """The page's live panel, re-rendered after a change."""
    return render(request, "web/fragments/capacity_panel.html", panel_context(fleet_capacity()))
