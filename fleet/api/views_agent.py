"""The agent's REST side: enrolment, and the fallback for agents that cannot hold a socket."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import authentication, exceptions, serializers, status
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    permission_classes,
    throttle_classes,
)
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle

from fleet.api import schema as _schema  # noqa: F401 - registers the OpenAPI auth scheme
from fleet.api.serializers import ErrorSerializer
from fleet.inventory import agents
from fleet.inventory.models import Host
from fleet.live.agent import handle_message
from fleet.partitioning import delivery
from fleet.partitioning.selectors import host_desired_state
from hostagent import protocol


class HostTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Token flh_…``: the request acts as that host and nothing else."""

    def authenticate(self, request: Request) -> tuple[Any, Host] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != protocol.AUTH_SCHEME.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header.")
        host = agents.host_authenticate(header[1].decode("latin-1"))
        if host is None:
            raise exceptions.AuthenticationFailed("Invalid host token.")
        from django.contrib.auth.models import AnonymousUser

        return AnonymousUser(), host

    def authenticate_header(self, request: Request) -> str:
        return protocol.AUTH_SCHEME


class IsAgent(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Host)


class EnrollThrottle(AnonRateThrottle):
    rate = "30/min"


EnrollIn = inline_serializer(
    "AgentEnrollRequest",
    {
        "enrollment_token": serializers.CharField(max_length=200),
        "hostname": serializers.CharField(max_length=255),
    },
)
EnrollOut = inline_serializer(
    "AgentEnrollResponse", {"host_id": serializers.IntegerField(), "token": serializers.CharField()}
)
AGENT_ERRORS = {
    400: OpenApiResponse(ErrorSerializer),
    401: OpenApiResponse(ErrorSerializer),
    403: OpenApiResponse(ErrorSerializer),
}
ENROLL_ERRORS = {
    **AGENT_ERRORS,
    429: OpenApiResponse(ErrorSerializer, description="Too many attempts"),
}


@extend_schema(request=EnrollIn, responses={201: EnrollOut, **ENROLL_ERRORS}, tags=["agent"])
@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
@throttle_classes([EnrollThrottle])
def enroll(request: Request) -> Response:
    """Trade a one-time enrollment token for the host's token (shown once, stored hashed)."""
    data = _validated(EnrollIn, request)
    host, token = agents.host_enroll(
        enrollment_token=data["enrollment_token"], hostname=data["hostname"]
    )
    return Response({"host_id": host.pk, "token": token}, status=status.HTTP_201_CREATED)


@extend_schema(
    responses={
        200: OpenApiResponse(description="A `desired_state` message (hostagent.protocol)"),
        204: None,
        **AGENT_ERRORS,
    },
    tags=["agent"],
)
@api_view(["GET"])
@authentication_classes([HostTokenAuthentication])
@permission_classes([IsAgent])
def desired_state(request: Request) -> Response:
    """The host's current desired state; recorded as dispatched."""
    host = _host(request)
    if host.desired_generation == 0:
        return Response(status=status.HTTP_204_NO_CONTENT)
    delivery.desired_state_push(host_id=host.pk)
    return Response(host_desired_state(Host.objects.get(pk=host.pk)))


ReportIn = inline_serializer(
    "AgentReport",
    {"messages": serializers.ListField(child=serializers.DictField(), max_length=1000)},
)


@extend_schema(
    request=ReportIn,
    responses={
        200: inline_serializer("AgentReportAccepted", {"accepted": serializers.IntegerField()}),
        **AGENT_ERRORS,
    },
    tags=["agent"],
)
@api_view(["POST"])
@authentication_classes([HostTokenAuthentication])
@permission_classes([IsAgent])
def report(request: Request) -> Response:
    """Up-messages (hello, telemetry, event, ack, pong) in the order they happened."""
    host = _host(request)
    data = _validated(ReportIn, request)
    messages = []
    for index, raw in enumerate(data["messages"]):
        try:
            message = protocol.validate_message(raw)
        except protocol.ProtocolError as error:
            raise exceptions.ValidationError({"messages": {str(index): str(error)}}) from None
        if message["type"] in ("desired_state", "ping"):
            raise exceptions.ValidationError(
                {"messages": {str(index): "only agent-to-server messages"}}
            )
        messages.append(message)
    for message in messages:
        handle_message(host.pk, message)  # type: ignore[arg-type]
    return Response({"accepted": len(messages)})


def _host(request: Request) -> Host:
    assert isinstance(request.auth, Host)  # IsAgent made sure
    return request.auth


def _validated(serializer: Any, request: Request) -> dict[str, Any]:
    instance = serializer.__class__(data=request.data)
    instance.is_valid(raise_exception=True)
    return dict(instance.validated_data)
