"""The capacity page (/capacity/): a GPU product chosen first (``?product=``, or all), a matrix
of MIG profiles by product (fits now / after reshaping idle instances), a labelled fragmentation
strip per host, per product MPS and whole-GPU room, and a "what would fit" form that asks the
REST API (``GET /api/v1/capacity/?kind=…``), and a repack proposal with its Apply
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
from fleet.web.presenters.capacity_matrix import capacity_matrix
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


def chosen_product(request: HttpRequest, payload: CapacityPayload) -> str:
    """The product the page shows (``?product=<catalog key>``); "" for all, or an unknown key."""
    wanted = request.GET.get("product", "")
    return wanted if any(p["product_key"] == wanted for p in payload["products"]) else ""


def panel_context(payload: CapacityPayload, product_key: str = "") -> dict[str, Any]:
    """What the live parts show: the profile-by-product matrix, the labelled host strip, and
    per product its profiles as bars (only ``product_key``'s when one is chosen)."""
    products = [
        {**p, "bars": _profile_bars(p)}
        for p in payload["products"]
        if not product_key or p["product_key"] == product_key
    ]
    fragmentation = payload["fragmentation"]
    hosts = [
        {**h, "heat": round(10 * h["score"]), "percent": round(100 * h["score"])}
        for h in fragmentation["hosts"]
    ]
    return {
        "matrix": capacity_matrix(payload, product_key),
        "chosen_product": product_key,
        "products": products,
        "fragmentation": fragmentation,
        "hosts": hosts,
        "score_percent": round(100 * fragmentation["score"]),
    }


def _profile_choices(payload: CapacityPayload, product_key: str) -> list[str]:
    """The MIG profiles the fleet's products (or the chosen one) offer, for the form (largest
    first, no repeats)."""
    names: list[str] = []
    for product in payload["products"]:
        if product_key and product["product_key"] != product_key:
            continue
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
    product_key = chosen_product(request, payload)
    context = {
        **page_context(request, "capacity"),
        **panel_context(payload, product_key),
        "product_choices": [p for p in payload["products"] if p["product_key"]],
        "profile_choices": _profile_choices(payload, product_key),
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
    """The page's live parts (the matrix and strip, the products), re-rendered after a change."""
    payload = fleet_capacity()
    context = panel_context(payload, chosen_product(request, payload))
    return render(request, "web/fragments/capacity_parts.html", context)
