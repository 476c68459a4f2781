"""``GET /prometheus/targets``: Prometheus' HTTP service discovery of the replicas' metrics
ports."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses
from fleet.api.permissions import spec_reader
from fleet.api.resources.prometheus.serializers import TargetGroupSerializer
from fleet.endpoints.discovery import scrape_targets


@extend_schema(
    responses={200: TargetGroupSerializer(many=True), **error_responses(401, 403)},
    description=(
        "Prometheus' `http_sd_configs` format: one target group per ready replica (running, "
        "its health check passing, on a host that is not offline) of each deployment whose "
        "workload declares a port named `metrics`, at its host's address and its host port for "
        "it. The deployments of the teams whose specs you see only. In Prometheus: "
        "`http_sd_configs: [{url: https://fleet.example/api/v1/prometheus/targets, "
        "authorization: {type: Token, credentials_file: /etc/prometheus/fleet-token}}]`."
    ),
)
@api_view(["GET"])
def targets(request: Request) -> Response:
    return Response(scrape_targets(spec_reader(request.user)))
