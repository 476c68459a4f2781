"""Dashboard pages. Every page is complete server-rendered HTML; the scripts only add live updates,
drag-and-drop and the editor's interactivity. Every action goes through the REST API."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url

from fleet.core.roles import Role, role_of
from fleet.inventory.models import SharingMode
from fleet.partitioning import converters
from fleet.partitioning.models import OperationKind, OperationStatus
from fleet.web import charts, editor, presenters, selectors

CHART_SPECS = (
    charts.ChartSpec("utilization_percent", "Utilisation", "%", 100),
    charts.ChartSpec("memory_used_mib", "Memory used", "MiB", 1024),
    charts.ChartSpec("temperature_c", "Temperature", "°C", 90),
    charts.ChartSpec("power_w", "Power", "W", 100),
)
HISTORY_BUCKET_S = 5.0


class LoginView(auth_views.LoginView):
    template_name = "web/login.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        return resolve_url("web:fleet")


class LogoutView(auth_views.LogoutView):
    next_page = "web:login"


def page_context(request: HttpRequest, section: str) -> dict[str, Any]:
    role = role_of(request.user)
    return {
        "section": section,
        "role": role.label,
        "can_operate": role >= Role.OPERATOR,
    }


FILTER_KEYS = ("q", "mode", "product", "health", "cordoned", "free")


def _filters(request: HttpRequest) -> dict[str, str]:
    return {key: request.GET.get(key, "").strip() for key in FILTER_KEYS}


def _matches(card: presenters.GpuCard, filters: dict[str, str]) -> bool:
    q = filters["q"].lower()
    checks = (
        not q or all(term in card.search_text for term in q.split()),
        not filters["mode"] or card.mode == filters["mode"],
        not filters["product"] or card.product_name == filters["product"],
        filters["health"] != "unhealthy" or card.unhealthy,
        not filters["cordoned"] or card.cordoned,
        not filters["free"] or card.free,
    )
    return all(checks)


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    """Every host and GPU, and the deployments tray."""
    filters = _filters(request)
    gpus = list(selectors.fleet_gpus())
    groups = presenters.host_groups(
        gpus,
        list(selectors.fleet_hosts()),
        selectors.gpus_applying(),
        selectors.latest_samples(gpus),
    )
    summary = presenters.fleet_summary(groups)
    products = sorted({g.product_name for g in gpus})
    if any(filters.values()):
        groups = [
            presenters.HostGroup(host=g.host, cards=[c for c in g.cards if _matches(c, filters)])
            for g in groups
        ]
        groups = [g for g in groups if g.cards]
    context = {
        **page_context(request, "fleet"),
        "groups": groups,
        "summary": summary,
        "filters": filters,
        "products": products,
        "modes": SharingMode.choices,
        "deployments": [presenters.deployment_card(d) for d in selectors.tray_deployments()],
        "na_title": presenters.NA_TITLE,
    }
    return render(request, "web/fleet.html", context)


def _gpu_or_404(gpu_id: int) -> Any:
    gpu = selectors.gpu_detail(gpu_id)
    if gpu is None:
        raise Http404("No such GPU.")
    return gpu


def _card(gpu: Any) -> tuple[presenters.GpuCard, dict[str, Any] | None, Any]:
    sample, received_at = selectors.latest_samples([gpu]).get(gpu.pk, (None, None))
    card = presenters.gpu_card(gpu, applying=bool(selectors.gpus_applying([gpu.pk])), sample=sample)
    return card, sample, received_at


def detail_context(gpu: Any) -> dict[str, Any]:
    card, sample, received_at = _card(gpu)
    return {
        "gpu": gpu,
        "card": card,
        "last_sample_at": received_at,
        "rows": presenters.partition_rows(gpu, card, sample),
        "events": selectors.gpu_events(gpu),
        "operations": selectors.operations_feed(gpu_id=gpu.pk, limit=15),
        "na_title": presenters.NA_TITLE,
    }


@login_required
def gpu_detail(request: HttpRequest, gpu_id: int) -> HttpResponse:
    """Live charts, partitions with their workloads and processes, events and operations."""
    gpu = _gpu_or_404(gpu_id)
    now = time.time()
    history = charts.downsample(selectors.gpu_history(gpu), bucket_s=HISTORY_BUCKET_S)
    chart_list = []
    for spec in CHART_SPECS:
        if spec.key == "memory_used_mib":
            spec = charts.ChartSpec(spec.key, spec.title, spec.unit, float(gpu.memory_mib))
        chart_list.append(charts.line_chart(history, spec, t0=now - 3600, t1=now))
    context = {
        **page_context(request, "fleet"),
        **detail_context(gpu),
        "charts": chart_list,
        "history": {"now": now, "points": history, "bucket_s": HISTORY_BUCKET_S},
    }
    return render(request, "web/gpu_detail.html", context)


@login_required
def layout_editor(request: HttpRequest, gpu_id: int) -> HttpResponse:
    """The MIG layout editor of one GPU (and its MPS / dedicated modes)."""
    gpu = _gpu_or_404(gpu_id)
    product = converters.product_of(gpu)
    card, _, _ = _card(gpu)
    context = {
        **page_context(request, "fleet"),
        "gpu": gpu,
        "card": card,
        "model": editor.editor_model(gpu, product),
        "product": product,
        "na_title": presenters.NA_TITLE,
        "whole": next((p for p in gpu.partitions.all() if p.kind == "gpu"), None),
    }
    return render(request, "web/layout_editor.html", context)


@login_required
def operations(request: HttpRequest) -> HttpResponse:
    """The audit trail: who asked for what, when, and how it ended."""
    status = request.GET.get("status", "")
    kind = request.GET.get("kind", "")
    context = {
        **page_context(request, "operations"),
        "operations": selectors.operations_feed(status=status, kind=kind, limit=200),
        "statuses": OperationStatus.choices,
        "kinds": OperationKind.choices,
        "status": status,
        "kind": kind,
    }
    return render(request, "web/operations.html", context)
