"""Dashboard pages. Every page is complete server-rendered HTML; the scripts only add live updates,
drag-and-drop and the editor's interactivity. Every action goes through the REST API."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.utils.functional import SimpleLazyObject

from fleet.allocations.models import Deployment
from fleet.core.forms import ThrottledAuthenticationForm, locked_seconds
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.roles import Role, role_of
from fleet.core.sso.oidc import provider_logout_url
from fleet.core.teams import operated_teams
from fleet.inventory.filters import GPU_FILTER_NAMES
from fleet.partitioning import converters
from fleet.web import charts, editor, hosts, presenters, selectors, tray, vocabulary
from fleet.web.access import role_required
from fleet.web.presenters_fleet_hosts import LAZY_AFTER_GPUS

CHART_SPECS = (
    charts.ChartSpec("utilization_percent", "Utilisation", "%", 100),
    charts.ChartSpec("memory_used_mib", "Memory used", "MiB", 1024),
    charts.ChartSpec("temperature_c", "Temperature", "°C", 90),
    charts.ChartSpec("power_w", "Power", "W", 100),
)
HISTORY_BUCKET_S = 5.0


class LoginView(auth_views.LoginView):
    """Sign-in; failures count towards a lockout (429, ``fleet.core.login_throttle``)."""

    template_name = "web/login.html"
    redirect_authenticated_user = True
    authentication_form = ThrottledAuthenticationForm

    def get_default_redirect_url(self) -> str:
        return resolve_url("web:fleet")

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["login_wait_s"] = locked_seconds(context.get("form"))
        context["oidc_provider"] = settings.FLEET_OIDC_PROVIDER_NAME
        context["oidc_enabled"] = settings.FLEET_OIDC_ENABLED
        context["sso_failed"] = self.request.GET.get("sso") == "failed"
        return context


class LogoutView(auth_views.LogoutView):
    """Sign out; after an OIDC sign-in, on to the provider to end its session too (when it
    publishes an ``end_session_endpoint``: :func:`fleet.core.sso.oidc.provider_logout_url`)."""

    next_page = "web:login"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        at_provider = provider_logout_url(request)  # before the session is flushed
        response: HttpResponse = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(at_provider) if at_provider else response


def page_context(request: HttpRequest, section: str, **config: Any) -> dict[str, Any]:
    """The context every page shares, with its one config object for the scripts
    (``page_config``: the UI vocabulary of ``fleet.web.vocabulary`` plus ``config``)."""
    role = role_of(request.user)
    can_operate = role >= Role.OPERATOR
    # Deployments: fleet operators act on all, a team operator on its teams' (the API checks).
    teams = operated_teams(request.user)
    can_deploy = can_operate or bool(teams)
    return {
        "section": section,
        "role": role.label,
        "can_operate": can_operate,
        "can_deploy": can_deploy,
        "operated_teams": teams,
        # A team operator moves its teams' replicas (lazy: only the GPU cards ask).
        "operable_deployments": SimpleLazyObject(
            lambda: set(Deployment.objects.filter(team_id__in=teams).values_list("pk", flat=True))
        )
        if teams and not can_operate
        else frozenset(),
        "page_config": {
            **vocabulary.base_config(
                role=role.label, can_operate=can_operate, can_deploy=can_deploy
            ),
            **config,
        },
    }


@role_required(Role.MEMBER)
def fleet(request: HttpRequest) -> HttpResponse:
    """Every host and GPU, and the deployments tray. The GPU filters narrow the GPUs shown (the
    same FilterSet as the API's); the summary and the product list describe the whole fleet.
    Past a few hundred GPUs only the first screen's cards are drawn (``fleet.web.hosts``)."""
    filters = {name: request.GET.get(name, "").strip() for name in GPU_FILTER_NAMES}
    view = hosts.hosts_view(request.GET)
    products = sorted({g.product_name for g in view.rows})
    gpu_filters = vocabulary.gpu_filters(products)
    context = {
        **page_context(request, "fleet", gpu_filters=gpu_filters),
        **hosts_context(view),
        "summary": presenters.fleet_summary(view.rows, view.utilization),
        "filters": filters,
        "gpu_filters": {f["name"]: f for f in gpu_filters},
        **tray.tray_context(request),
    }
    return render(request, "web/fleet.html", context)


def hosts_context(view: hosts.HostsView) -> dict[str, Any]:
    """What ``web/partials/hosts.html`` draws: the groups, and the counts the browser reads."""
    return {
        "fleet_hosts": view,
        "groups": view.groups,
        "lazy_after": LAZY_AFTER_GPUS,
        "na_title": presenters.NA_TITLE,
    }


def _gpu_or_404(gpu_id: int) -> Any:
    gpu = selectors.gpu_detail(gpu_id)
    if gpu is None:
        raise Http404("No such GPU.")
    return gpu


def _card(gpu: Any) -> tuple[presenters.GpuCard, dict[str, Any] | None, Any]:
    sample, received_at = selectors.latest_samples([gpu]).get(gpu.pk, (None, None))
    applying = bool(selectors.gpus_applying([gpu.pk]))
    card = presenters.safe_gpu_card(gpu, applying=applying, sample=sample)
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


@role_required(Role.MEMBER)
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


@role_required(Role.MEMBER)
def layout_editor(request: HttpRequest, gpu_id: int) -> HttpResponse:
    """The MIG layout editor of one GPU (and its MPS / dedicated modes)."""
    gpu = _gpu_or_404(gpu_id)
    product = converters.product_of(gpu)
    card, _, _ = _card(gpu)
    context = {
        **page_context(request, "fleet", **vocabulary.editor_config(gpu.memory_mib)),
        "gpu": gpu,
        "card": card,
        "model": editor.editor_model(gpu, product),
        "product": product,
        "na_title": presenters.NA_TITLE,
        "whole": next((p for p in gpu.partitions.all() if p.kind == "gpu"), None),
    }
    return render(request, "web/layout_editor.html", context)


OPERATIONS_PAGE = 200
OPERATION_FILTERS = ("status", "kind", "user", "since", "until")


@role_required(Role.MEMBER)
def operations(request: HttpRequest) -> HttpResponse:
    """The audit trail: who asked for what, when, and how it ended; filtered as the API filters,
    200 rows a page (older pages by a ``before`` cursor), and the same rows as CSV."""
    page = selectors.operations_page(request.GET, size=OPERATIONS_PAGE)
    filters = {name: request.GET.get(name, "")[:150] for name in OPERATION_FILTERS}
    query = urlencode({k: v for k, v in filters.items() if v})
    context = {
        **page_context(request, "operations"),
        "operations": page.rows,
        "errors": page.errors,
        "older": f"?{query}&before={page.older}" if page.older else "",
        "newest": f"?{query}" if request.GET.get("before") else "",
        "csv": f"/api/v1/operations/?{query}&format=csv"
        if query
        else "/api/v1/operations/?format=csv",
        # Live rows join only the first page of a feed that can still grow.
        "live": not request.GET.get("before") and not filters["until"],
        "statuses": OperationStatus.choices,
        "kinds": OperationKind.choices,
        # Under their own name: a filter called ``user`` hid the signed-in user from the page.
        "filters": filters,
    }
    return render(request, "web/operations.html", context)
