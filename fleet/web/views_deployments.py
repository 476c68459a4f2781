"""The deployment pages: the list of every deployment and one deployment's replicas, and the
fragments their scripts re-fetch after a ``changed`` frame. Scaling goes through the REST API
(``PATCH /api/v1/deployments/{id}/``) like every other action."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.allocations.models import Deployment
from fleet.allocations.scaling import MAX_REPLICAS, MIN_REPLICAS
from fleet.autoscaling.models import Metric
from fleet.autoscaling.presenters import autoscaling_chart, autoscaling_panel
from fleet.core.models import Team
from fleet.core.roles import Role, role_of
from fleet.core.teams import can_operate_team, can_see_spec, operated_teams
from fleet.endpoints.presenters import endpoint_panel
from fleet.web import presenters_deployments as presenters
from fleet.web import selectors
from fleet.web.access import role_required
from fleet.web.replica_metrics import metrics_context
from fleet.web.traffic_charts import traffic_charts
from fleet.web.tray import unplaced_fits
from fleet.web.views import page_context


def _list_context(request: HttpRequest) -> dict[str, Any]:
    """The rows, of one team when ``?team=`` names its slug (the same filter as the API's)."""
    team = request.GET.get("team", "").strip()[:100]
    queryset = selectors.tray_deployments()
    if team:
        queryset = queryset.filter(team__slug=team)
    deployments = list(queryset)
    fits = unplaced_fits(deployments)
    return {
        "rows": [
            presenters.deployment_row(
                d, sees_spec=can_see_spec(request.user, d.team_id), fit=fits.get(d.pk)
            )
            for d in deployments
        ],
        "team": team,
        "teams": list(Team.objects.order_by("name").values_list("slug", "name")),
    }


@role_required(Role.MEMBER)
def deployment_list(request: HttpRequest) -> HttpResponse:
    """Every deployment (or one team's): its team, request, what it runs, its replicas and its
    state."""
    context = {
        **page_context(request, "deployments"),
        **_list_context(request),
        # After a delete on its page: what was deleted (its name, as the page gave it).
        "deleted": request.GET.get("deleted", "")[:200],
    }
    return render(request, "web/deployments.html", context)


def _deployment_or_404(deployment_id: int) -> Deployment:
    deployment = selectors.deployment_detail(deployment_id)
    if deployment is None:
        raise Http404("No such deployment.")
    return deployment


def detail_context(deployment: Deployment, *, sees_spec: bool) -> dict[str, Any]:
    rows = presenters.replica_rows(deployment, now=timezone.now())
    autoscaling = autoscaling_panel(deployment)
    row = presenters.deployment_row(
        deployment, sees_spec=sees_spec, fit=unplaced_fits([deployment]).get(deployment.pk)
    )
    return {
        "deployment": deployment,
        "sees_spec": sees_spec,
        "row": row,
        "runtime": row.runtime,
        "replicas": rows,
        "gpu_ids": sorted({r.gpu_id for r in rows if r.gpu_id is not None}),
        "operations": selectors.operations_feed(deployment_id=deployment.pk, limit=20),
        "events": selectors.deployment_events(deployment),
        "endpoint": (endpoint := endpoint_panel(deployment)),
        "traffic_charts": traffic_charts(deployment.pk) if endpoint else None,
        "autoscaling": autoscaling,
        "autoscaling_chart": autoscaling_chart(deployment, autoscaling),
    }


@role_required(Role.MEMBER)
def deployment_detail(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """The spec, the replica count (operators change it), every replica with its slice and
    workload, and the deployment's operations and events. What it runs (its workload), its
    logs and its replica metrics only for its team's members and fleet viewers and up."""
    deployment = _deployment_or_404(deployment_id)
    sees_spec = can_see_spec(request.user, deployment.team_id)
    context = {
        **page_context(request, "deployments", deployment=deployment.pk),
        **detail_context(deployment, sees_spec=sees_spec),
        # Its team's operators act on it too (scale, roll out, delete); making room moves other
        # deployments' replicas: fleet operators only.
        "can_operate": can_operate_team(request.user, deployment.team_id),
        "can_defrag": role_of(request.user) >= Role.OPERATOR,
        "handoff_teams": _handoff_teams(request.user, deployment),
        "request_items": presenters.request_items(deployment),
        "workload_json": presenters.workload_json(deployment.workload) if sees_spec else "",
        "min_replicas": MIN_REPLICAS,
        "autoscaling_metrics": Metric.choices,
        # A replica's own metric is read on one of the workload's declared ports.
        "declared_ports": [
            str(p.get("name", ""))
            for p in (deployment.workload or {}).get("ports") or []
            if isinstance(p, dict) and p.get("name")
        ],
        "max_replicas": MAX_REPLICAS,
        **(metrics_context(deployment, request.GET) if sees_spec else {}),
    }
    return render(request, "web/deployment_detail.html", context)


def _handoff_teams(user: Any, deployment: Deployment) -> list[Team]:
    """The teams the user may hand the deployment to (operating it and them), by name."""
    if not can_operate_team(user, deployment.team_id):
        return []
    teams = Team.objects.exclude(pk=deployment.team_id).order_by("name")
    if role_of(user) < Role.OPERATOR:
        teams = teams.filter(pk__in=operated_teams(user))
    return list(teams)


@never_cache
@require_GET
@role_required(Role.MEMBER)
def deployment_rows(request: HttpRequest) -> HttpResponse:
    """Every row of the deployments list, re-rendered after a change."""
    return render(request, "web/fragments/deployment_rows.html", _list_context(request))


@never_cache
@require_GET
@role_required(Role.MEMBER)
def deployment_panel(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """The deployment page's live parts, re-rendered after a change."""
    deployment = _deployment_or_404(deployment_id)
    context = {
        **page_context(request, "deployments"),
        **detail_context(deployment, sees_spec=can_see_spec(request.user, deployment.team_id)),
        "can_operate": can_operate_team(request.user, deployment.team_id),
    }
    return render(request, "web/fragments/deployment_panel.html", context)
