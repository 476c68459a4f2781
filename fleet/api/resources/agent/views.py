"""The agent's REST side: enrolment, and the fallback for agents that cannot hold a socket.

A REST agent's token is renewed in the answer to its report (``host_token``, the same message a
socket sends; :mod:`fleet.agents.host_tokens`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import authentication, exceptions, status
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    parser_classes,
    permission_classes,
)
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.agents.delivery import desired_document
from fleet.agents.enrollment import host_authenticate, host_enroll
from fleet.agents.guard import Refused, admit_parsed, rest_guard
from fleet.agents.host_tokens import host_renewal_due, host_token_renew
from fleet.agents.messages import handle_message
from fleet.api import schema as _schema  # noqa: F401 - registers the OpenAPI auth scheme
from fleet.api.common import error_responses, validated
from fleet.api.limits import throttle_scope
from fleet.api.parsers import EnrollJsonParser, ReportJsonParser
from fleet.api.resources.agent.serializers import (
    AgentEnrollRequestSerializer,
    AgentEnrollResponseSerializer,
    AgentReportAcceptedSerializer,
    AgentReportSerializer,
)
from fleet.core.errors import ServiceError
from fleet.inventory import refusals
from fleet.inventory.models import Host
from hostagent import protocol


class HostTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Token flh_…``: the request acts as that host and nothing else."""

    def authenticate(self, request: Request) -> tuple[Any, Host] | None:
        token = presented_token(request)
        if token is None:
            return None
        # Unknown, revoked and expired tokens are refused alike (the log tells them apart).
        host = host_authenticate(token)
        if host is None:
            raise exceptions.AuthenticationFailed("Invalid host token.")
        from django.contrib.auth.models import AnonymousUser

        return AnonymousUser(), host

    def authenticate_header(self, request: Request) -> str:
        return protocol.AUTH_SCHEME


def presented_token(request: Request) -> str | None:
    """The host token of ``Authorization: Token …``; ``None`` without one."""
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() != protocol.AUTH_SCHEME.lower().encode():
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Invalid token header.")
    return header[1].decode("latin-1")


class IsAgent(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Host)


@extend_schema(
    request=AgentEnrollRequestSerializer,
    responses={
        201: AgentEnrollResponseSerializer,
        **error_responses(400, 401, 403, described={429: "Too many attempts"}),
    },
    tags=["agent"],
)
@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
@parser_classes([EnrollJsonParser])
@throttle_scope("enroll")
def enroll(request: Request) -> Response:
    """Trade a one-time enrollment token for the host's token (shown once, stored hashed)."""
    data = validated(AgentEnrollRequestSerializer, request)
    host, token = host_enroll(enrollment_token=data["enrollment_token"], hostname=data["hostname"])
    return Response({"host_id": host.pk, "token": token}, status=status.HTTP_201_CREATED)


@extend_schema(
    responses={
        200: OpenApiResponse(description="A `desired_state` message (hostagent.protocol)"),
        204: None,
        **error_responses(400, 401, 403),
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
    return Response(desired_document(host.pk))  # built once, recorded as dispatched


@extend_schema(
    request=AgentReportSerializer,
    responses={
        200: AgentReportAcceptedSerializer,
        **error_responses(
            400,
            401,
            403,
            described={
                426: "`agent.protocol_unsupported`: the hello's protocol is older than the one "
                "before this server's, or newer than the server's (details: `protocol`, "
                "`served`); the hello and what follows it were not applied."
            },
        ),
    },
    tags=["agent"],
)
@api_view(["POST"])
@authentication_classes([HostTokenAuthentication])
@permission_classes([IsAgent])
@parser_classes([ReportJsonParser])
def report(request: Request) -> Response:
    """Up-messages (hello, telemetry, event, ack, pong) in the order they happened."""
    host = _host(request)
    data = validated(AgentReportSerializer, request)
    messages = []
    for index, raw in enumerate(data["messages"]):
        try:
            messages.append(admit_parsed(raw))
        except Refused as refusal:
            # The whole report is refused: nothing of it is applied, for this host or any.
            refusals.refused(host.pk, refusal.reason, refusal.message)
            refusals.flush()
            raise ServiceError(
                f"protocol.{refusal.reason}",
                f"Message {index} was refused: {refusal.message}",
                {"messages": {str(index): refusal.message}},
            ) from None
    # Past the host's budget (a backlog of ticks after an outage, an event storm) a message is
    # skipped, not the report: the agent would only send the same report again.
    guard = rest_guard(host.pk)
    accepted = 0
    for message in messages:
        try:
            guard.check_rate(message)
        except Refused as refusal:
            refusals.refused(host.pk, refusal.reason, refusal.message)
            continue
        handle_message(host.pk, message)
        accepted += 1
    refusals.flush()
    body: dict[str, Any] = {"accepted": accepted}
    token = presented_token(request) or ""
    if host_renewal_due(host, token):
        renewed = host_token_renew(host_id=host.pk, token=token)
        if renewed is not None:
            body["host_token"] = renewed
    return Response(body)


def _host(request: Request) -> Host:
    assert isinstance(request.auth, Host)  # IsAgent made sure
    return request.auth
