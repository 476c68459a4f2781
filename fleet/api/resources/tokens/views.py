"""``/tokens/``: your own API tokens."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import ReadViewSet, documented_reads, error_responses, validated
from fleet.api.resources.tokens.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
)
from fleet.core.models import ApiToken
from fleet.core.roles import Role
from fleet.core.services import api_token_create, api_token_revoke


@documented_reads(ApiTokenSerializer)
class ApiTokenViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, ReadViewSet[ApiToken]):
    """Your own API tokens (any role): create one for a script, list them, revoke one."""

    serializer_class = ApiTokenSerializer
    required_roles = {"create": Role.MEMBER, "destroy": Role.MEMBER}
    filterset_class = None
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False) or not self.request.user.is_authenticated:
            return ApiToken.objects.none()  # the schema generator has no user
        return ApiToken.objects.filter(user_id=self.request.user.pk).order_by("-created_at")

    @extend_schema(
        request=ApiTokenCreateSerializer,
        responses={201: ApiTokenCreatedSerializer, **error_responses(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A new token, optionally expiring; 409 ``token.limit`` past the per-user cap."""
        data = validated(ApiTokenCreateSerializer, request)
        token, secret = api_token_create(
            user=request.user, name=data["name"], expires_in_days=data.get("expires_in_days")
        )
        body = ApiTokenSerializer(token).data
        return Response({**body, "token": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, **error_responses(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        api_token_revoke(token=self.get_object(), requested_by=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
