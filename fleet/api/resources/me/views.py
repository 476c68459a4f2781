"""``/me``: the authenticated user and their role."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import error_responses
from fleet.api.resources.me.serializers import MeSerializer
from fleet.core.roles import role_of


@extend_schema(responses={200: MeSerializer, **error_responses(401, 403)})
@api_view(["GET"])
def me(request: Request) -> Response:
    """The authenticated user and their role."""
    return Response({"username": request.user.get_username(), "role": role_of(request.user).label})
