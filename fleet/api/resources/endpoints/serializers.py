"""A deployment's endpoint, as the API reads and writes it."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.endpoints.history import POINT_S, WINDOWS_S
from fleet.endpoints.models import DEFAULT_DRAIN_S, Endpoint
from fleet.endpoints.services import endpoint_url
from hostagent.protocol import MAX_DRAIN_S


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
    drain_s = serializers.IntegerField(
        min_value=0,
        max_value=MAX_DRAIN_S,
        required=False,
        help_text="Seconds a replica stays up out of rotation before it is stopped (moved, "
        "scaled in, replaced, drained): the gateways stop sending it requests, those in flight "
        f"finish, then SIGTERM and its stop grace. Default {DEFAULT_DRAIN_S}.",
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
        "drain_s": endpoint.drain_s,
        "url": endpoint_url(endpoint),
    }


class ReplicaTrafficSerializer(serializers.Serializer[Any]):
    allocation = serializers.IntegerField(source="allocation_id")
    state = serializers.ChoiceField(
        choices=["ready", "draining", "down", "maint"],
        help_text="The balancer's word for the copy (the worst of the gateways').",
    )
    requests_per_s = serializers.FloatField(allow_null=True)
    errors_per_s = serializers.FloatField(allow_null=True)
    in_flight = serializers.IntegerField()
    response_ms = serializers.FloatField(
        allow_null=True, help_text="HAProxy's average over its last 1,024 requests."
    )


class TrafficQuerySerializer(serializers.Serializer[Any]):
    window = serializers.ChoiceField(
        choices=list(WINDOWS_S),
        required=False,
        help_text=f"Add the endpoint's history over this window: a point per {POINT_S} s "
        "(kept an hour).",
    )


class TrafficPointSerializer(serializers.Serializer[Any]):
    ts = serializers.DateTimeField(help_text=f"The start of the point's {POINT_S} s.")
    requests_per_s = serializers.FloatField(allow_null=True)
    errors_per_s = serializers.FloatField(allow_null=True)
    in_flight = serializers.IntegerField()
    queued = serializers.IntegerField()
    response_ms = serializers.FloatField(allow_null=True)
    ready_replicas = serializers.IntegerField(help_text="Replicas in the balancer's rotation.")


class TrafficSerializer(serializers.Serializer[Any]):
    """``GET /deployments/{id}/traffic``: what the gateways measured over their last 5 s."""

    requests_per_s = serializers.FloatField(allow_null=True)
    errors_per_s = serializers.FloatField(allow_null=True, help_text="5xx answers per second.")
    in_flight = serializers.IntegerField()
    queued = serializers.IntegerField(help_text="Requests waiting for a replica.")
    response_ms = serializers.FloatField(
        allow_null=True, help_text="The replicas' average, weighted by their request rates."
    )
    gateways = serializers.IntegerField(help_text="Gateways that measured it in the last 10 s.")
    updated_at = serializers.DateTimeField()
    replicas = ReplicaTrafficSerializer(many=True)
    history = TrafficPointSerializer(
        many=True,
        required=False,
        help_text="With `?window=`: the points of that window, oldest first, the gateways "
        "summed; absent without it.",
    )


def traffic_read(traffic: Any, history: list[Any] | None = None) -> dict[str, Any]:
    extra = {} if history is None else {"history": history}
    return {
        **extra,
        "requests_per_s": traffic.requests_per_s,
        "errors_per_s": traffic.errors_per_s,
        "in_flight": traffic.in_flight,
        "queued": traffic.queued,
        "response_ms": traffic.response_ms,
        "gateways": traffic.gateways,
        "updated_at": traffic.updated_at,
        "replicas": list(traffic.replicas.values()),
    }
