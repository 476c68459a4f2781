"""HTML fragments the live scripts fetch after a ``changed`` frame or a reconnect, so the
server-rendered markup stays the single source of truth for every card and row."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.core.roles import Role
from fleet.partitioning import converters
from fleet.web import charts, editor, hosts, selectors
from fleet.web.access import role_required
from fleet.web.tray import gpu_name, tray_context
from fleet.web.views import (
    HISTORY_BUCKET_S,
    _gpu_or_404,
    detail_context,
    hosts_context,
    page_context,
)

MAX_IDS = 2000


def _ids(request: HttpRequest, name: str) -> list[int]:
    raw = request.GET.get(name, "")
    return [int(part) for part in raw.split(",") if part.strip().isdecimal()][:MAX_IDS]


@never_cache
@require_GET
@role_required(Role.MEMBER)
def cards(request: HttpRequest) -> HttpResponse:
    """GPU cards (and their host headers) for changed GPUs, partitions, allocations or hosts;
    ``?all=1`` for every card (the re-sync after a reconnect). ``?drawn=`` (a page that draws
    host groups as they scroll into view): only these hosts' cards, the others' headers. GPU
    filters in the query keep only the GPUs they match (drawing a filtered page's hosts)."""
    host_ids = _ids(request, "host")
    drawn = set(_ids(request, "drawn")) if "drawn" in request.GET else None
    if request.GET.get("all"):
        gpu_ids: set[int] | None = None
        scope: set[int] | None = None
    else:
        gpu_ids = selectors.gpu_ids_touched(
            gpu_ids=_ids(request, "gpu"),
            partition_ids=_ids(request, "partition"),
            allocation_ids=_ids(request, "allocation"),
            host_ids=host_ids,
        )
        scope = selectors.host_ids_of(gpu_ids) | set(host_ids)
    view = hosts.hosts_view(
        request.GET, host_ids=scope, gpu_ids=gpu_ids, drawn=drawn, lazy_after=None
    )
    context = {**page_context(request, "fleet"), **hosts_context(view)}
    return render(request, "web/fragments/cards.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def host_groups(request: HttpRequest) -> HttpResponse:
    """The fleet view's host groups for the GPU filters in the query, as the page draws them:
    what a search or a filter shows, matched by the server across the whole fleet."""
    view = hosts.hosts_view(request.GET)
    context = {**page_context(request, "fleet"), **hosts_context(view)}
    return render(request, "web/fragments/hosts.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def tray(request: HttpRequest) -> HttpResponse:
    context = {**page_context(request, "fleet"), **tray_context(request)}
    return render(request, "web/fragments/tray.html", context)


MAX_NAMED_GPUS = 500


@never_cache
@require_GET
@role_required(Role.MEMBER)
def gpu_names(request: HttpRequest) -> JsonResponse:
    """``?id=3,4``: each GPU's name as the pages say it (``a100-b01/gpu0``), for the scripts
    that hold GPU ids only (the fit preview, refusals); at most 500 a request, unknown ids
    left out."""
    ids = _ids(request, "id")[:MAX_NAMED_GPUS]
    gpus, _ = selectors.target_rows(gpu_ids=ids, partition_ids=())
    return JsonResponse({"names": {str(pk): gpu_name(gpu) for pk, gpu in gpus.items()}})


@never_cache
@require_GET
@role_required(Role.MEMBER)
def operation_rows(request: HttpRequest) -> HttpResponse:
    ids = _ids(request, "id")
    context = {"operations": selectors.operations_feed(ids=ids, limit=len(ids) or 1)}
    return render(request, "web/fragments/operation_rows.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def gpu_panel(request: HttpRequest, gpu_id: int) -> HttpResponse:
    """The GPU detail's header, partitions, events and operations, re-rendered after a change."""
    gpu = _gpu_or_404(gpu_id)
    context = {**page_context(request, "fleet"), **detail_context(gpu)}
    return render(request, "web/fragments/gpu_panel.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def gpu_history(request: HttpRequest, gpu_id: int) -> JsonResponse:
    """The last hour of the GPU's telemetry in 5-second means (``null`` where NVML had none)."""
    gpu = _gpu_or_404(gpu_id)
    points = charts.downsample(selectors.gpu_history(gpu), bucket_s=HISTORY_BUCKET_S)
    return JsonResponse({"bucket_s": HISTORY_BUCKET_S, "points": points})


@never_cache
@require_GET
@role_required(Role.MEMBER)
def gpu_editor_model(request: HttpRequest, gpu_id: int) -> JsonResponse:
    """The layout editor's model (profiles, current instances and their workloads, presets)."""
    gpu = _gpu_or_404(gpu_id)
    return JsonResponse(editor.editor_model(gpu, converters.product_of(gpu)))
