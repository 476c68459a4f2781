"""A deployment's endpoint, as the API reads and writes it."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.endpoints.models import Endpoint
from fleet.endpoints.services import endpoint_url


class EndpointSerializer(serializers.Serializer[Any]):
    port = serializers.CharField(
        max_length=15,
        required=False,
        help_text="The workload's declared port the endpoint sends requests to (default: its "
        "first).",
    )
    path_prefix = serializers.CharField(
        max_length=128,
        required=False,
        allow_null=True,
        help_text="One path segment, e.g. `/qwen`: requests to `/qwen/...` reach this "
        "deployment as `/...` (with `X-Forwarded-Prefix: /qwen`).",
    )
    hostname = serializers.CharField(
        max_length=253,
        required=False,
        allow_null=True,
        help_text="Requests with this `Host` reach this deployment (checked before paths).",
    )


class EndpointReadSerializer(EndpointSerializer):
    url = serializers.CharField(
        allow_null=True,
        help_text="What a caller uses: the gateway's `FLEET_GATEWAY_URL` with the host name and "
        "path; `null` when no gateway URL is configured and there is no host name.",
    )


def endpoint_read(deployment: Any) -> dict[str, Any] | None:
    try:
        endpoint: Endpoint = deployment.endpoint
    except Endpoint.DoesNotExist:
        return None
    return {
        "port": endpoint.port,
        "path_prefix": endpoint.path_prefix,
        "hostname": endpoint.hostname,
        "url": endpoint_url(endpoint),
    }
