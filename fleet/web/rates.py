"""``/ui/replica-rates``: each replica's request rate as the gateways measured it over their last
5 s, for the fleet view's replica tooltips (``static/web/fleet/rates.js`` asks every 5 s while
the page is visible). A rate is a replica metric: another team's member is not told it."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from fleet.allocations.models import Deployment
from fleet.core.roles import Role
from fleet.core.teams import can_see_spec
from fleet.endpoints.traffic import traffic_of
from fleet.web.access import role_required


@never_cache
@require_GET
@role_required(Role.MEMBER)
def replica_rates(request: HttpRequest) -> JsonResponse:
    """``{"rates": {"<allocation id>": req/s or null}}``: the replicas some gateway measured in
    the last 10 s (``null``: measuring), of the deployments the user may see the metrics of."""
    teams = dict(Deployment.objects.filter(endpoint__isnull=False).values_list("pk", "team_id"))
    visible = [pk for pk, team in teams.items() if can_see_spec(request.user, team)]
    rates = {
        str(allocation_id): replica.requests_per_s
        for traffic in traffic_of(visible).values()
        for allocation_id, replica in traffic.replicas.items()
    }
    return JsonResponse({"rates": rates})
