"""The host pages: the list of every host and one host with its GPUs, labels, reservation,
maintenance and operations, and the fragments their scripts re-fetch after a ``changed`` frame.
Cordon, uncordon, drain, labels and the reservation go through the REST API
(``/api/v1/hosts/{id}/…``) like every other action."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.allocations.maintenance import MAX_SCHEDULE_AHEAD, scheduled_drains
from fleet.allocations.models import AllocationState
from fleet.core.roles import Role, role_of
from fleet.inventory.labels import MAX_KEY_CHARS, MAX_LABELS, MAX_VALUE_CHARS
from fleet.inventory.models import Gpu, Host
from fleet.inventory.reservations import reserved_slugs
from fleet.web import presenters_hosts as presenters
from fleet.web import selectors
from fleet.web.access import role_required
from fleet.web.views import page_context


def _list_context() -> dict[str, Any]:
    hosts = list(selectors.hosts_with_gpus())
    drains = scheduled_drains([h.pk for h in hosts])
    return {"rows": [presenters.host_row(h, drains.get(h.pk)) for h in hosts]}


@role_required(Role.MEMBER)
def host_list(request: HttpRequest) -> HttpResponse:
    """Every host: its status, agent, GPUs, labels and when it was last seen."""
    context = {**page_context(request, "hosts"), **_list_context()}
    return render(request, "web/hosts.html", context)


def _host_or_404(host_id: int) -> Host:
    host = selectors.hosts_with_gpus(host_id=host_id).first()
    if host is None:
        raise Http404("No such host.")
    return host


def detail_context(host: Host) -> dict[str, Any]:
    row = presenters.host_row(host, scheduled_drains([host.pk]).get(host.pk))
    gpus = (
        Gpu.objects.filter(host=host)
        .annotate(
            replicas=Count("allocations", filter=~Q(allocations__state=AllocationState.RELEASING))
        )
        .order_by("index")
    )
    return {
        "host": host,
        "row": row,
        "reserved_for": reserved_slugs(host),
        "gpus": list(gpus),
        "operations": selectors.operations_feed(host_id=host.pk, limit=20),
    }


@role_required(Role.MEMBER)
def host_detail(request: HttpRequest, host_id: int) -> HttpResponse:
    """The host: its agent, GPUs, labels, maintenance (operators cordon, uncordon and drain
    it, now or at a time, and edit its labels) and operations."""
    host = _host_or_404(host_id)
    context = {
        **page_context(request, "hosts", host=host.pk),
        **detail_context(host),
        "max_days_ahead": MAX_SCHEDULE_AHEAD.days,
        "max_labels": MAX_LABELS,
        "max_key_chars": MAX_KEY_CHARS,
        "max_value_chars": MAX_VALUE_CHARS,
        "can_reserve": role_of(request.user) >= Role.ADMIN,
    }
    return render(request, "web/host_detail.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def host_rows(request: HttpRequest) -> HttpResponse:
    """Every row of the hosts list, re-rendered after a change."""
    return render(request, "web/fragments/host_rows.html", _list_context())


@never_cache
@require_GET
@role_required(Role.MEMBER)
def host_panel(request: HttpRequest, host_id: int) -> HttpResponse:
    """The host page's live parts, re-rendered after a change."""
    host = _host_or_404(host_id)
    context = {**page_context(request, "hosts"), **detail_context(host)}
    return render(request, "web/fragments/host_panel.html", context)
