"""The layout rollouts page: every fleet-wide layout rollout with its progress, live; operators
resume or abort one there (the REST API does the work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.core.models import Operation, OperationKind
from fleet.core.operations import RUNNING
from fleet.core.roles import Role
from fleet.inventory.models import Gpu
from fleet.web.access import role_required
from fleet.web.views import page_context


@dataclass(frozen=True)
class RolloutRow:
    id: int
    summary: str
    status: str
    running: bool
    paused: str | None
    done: int
    draining: int
    total: int
    created_at: Any
    requested_by: str
    reason: str
    last_note: str

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 100


def _row(operation: Operation) -> RolloutRow:
    payload = operation.payload if isinstance(operation.payload, dict) else {}
    done = len(payload.get("done") or [])
    draining = len(payload.get("draining") or {})
    total = done + draining + len(payload.get("pending") or [])
    log = payload.get("log") or []
    return RolloutRow(
        id=operation.pk,
        summary=operation.summary,
        status=operation.status,
        running=operation.status in RUNNING,
        paused=payload.get("paused"),
        done=done,
        draining=draining,
        total=total,
        created_at=operation.created_at,
        requested_by=operation.requested_by_name or "—",
        reason=operation.reason,
        last_note=str(log[-1].get("note", "")) if log and isinstance(log[-1], dict) else "",
    )


def _rows() -> list[RolloutRow]:
    query = Operation.objects.filter(kind=OperationKind.LAYOUT_ROLLOUT).select_related(
        "requested_by"
    )
    return [_row(operation) for operation in query.order_by("-id")[:100]]


@role_required(Role.MEMBER)
def rollouts(request: HttpRequest) -> HttpResponse:
    products = Gpu.objects.filter(mig_capable=True).values_list("product_name", flat=True)
    context = {
        **page_context(request, "rollouts"),
        "rows": _rows(),
        "products": sorted(set(products)),  # the New rollout form's choice of MIG products
    }
    return render(request, "web/rollouts.html", context)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def rollout_rows(request: HttpRequest) -> HttpResponse:
    context = {**page_context(request, "rollouts"), "rows": _rows()}
    return render(request, "web/fragments/rollout_rows.html", context)
