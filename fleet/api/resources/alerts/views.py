"""``/api/v1/alerts/``: webhooks (create, list, change, delete) and the delivery log; admins
only. Thin: parse, call :mod:`fleet.core.webhooks`, render."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import ReadViewSet, documented_reads, error_responses
from fleet.api.filters import DeliveryFilter
from fleet.api.resources.alerts.serializers import (
    DeliverySerializer,
    WebhookInputSerializer,
    WebhookSerializer,
)
from fleet.core import webhooks
from fleet.core.models import AlertDelivery, AlertWebhook
from fleet.core.permissions import IsAdminRole


@documented_reads(WebhookSerializer)
class WebhookViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, ReadViewSet[AlertWebhook]):
    """Where alerts are sent. The secret is write-only: it is never in a response."""

    permission_classes = [IsAdminRole]
    serializer_class = WebhookSerializer
    queryset = AlertWebhook.objects.order_by("id")
    filterset_class = None
    ordering_fields = ["id"]

    @extend_schema(
        request=WebhookInputSerializer,
        responses={201: WebhookSerializer, **error_responses(400, 401, 403, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = WebhookInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        webhook = webhooks.webhook_create(data=dict(serializer.validated_data), user=request.user)
        return Response(WebhookSerializer(webhook).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=WebhookInputSerializer(partial=True),
        responses={200: WebhookSerializer, **error_responses(400, 401, 403, 404)},
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = WebhookInputSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        webhook = webhooks.webhook_update(
            webhook_id=self.get_object().pk, data=dict(serializer.validated_data), user=request.user
        )
        return Response(WebhookSerializer(webhook).data)

    @extend_schema(responses={204: None, **error_responses(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        webhooks.webhook_delete(webhook_id=self.get_object().pk, user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


@documented_reads(DeliverySerializer)
class DeliveryViewSet(ReadViewSet[AlertDelivery]):
    """The delivery log: every alert sent or being retried, its attempts and last answer."""

    permission_classes = [IsAdminRole]
    serializer_class = DeliverySerializer
    filterset_class = DeliveryFilter
    ordering_fields = ["created_at", "status"]

    def get_queryset(self) -> QuerySet[AlertDelivery]:
        return AlertDelivery.objects.order_by("-created_at", "-id")
