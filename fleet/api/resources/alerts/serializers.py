"""Alert webhooks and their delivery log (admins only). The secret and the whole URL are
write-only."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.fields import BoundedListField
from fleet.core.alerts import EVENTS
from fleet.core.models import AlertDelivery, AlertFormat, AlertWebhook
from fleet.core.webhooks import MAX_SECRET_CHARS, MAX_URL_CHARS, MIN_SECRET_CHARS


class WebhookSerializer(serializers.ModelSerializer[AlertWebhook]):
    url = serializers.CharField(
        help_text="What may be shown of the URL: scheme://host[:port], and /… when it has a "
        "path, a query or credentials (the whole URL is write-only, encrypted at rest)."
    )
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS))
    format = serializers.ChoiceField(choices=AlertFormat.choices)

    class Meta:
        model = AlertWebhook
        fields = ["id", "url", "events", "format", "enabled", "created_at", "updated_at"]
        read_only_fields = fields


class WebhookInputSerializer(serializers.Serializer[Any]):
    url = serializers.CharField(
        max_length=MAX_URL_CHARS,
        help_text="http:// or https://; a user:password@ is sent as HTTP Basic. Write-only: "
        "answers show scheme://host[:port]/… only.",
    )
    events = BoundedListField(
        child=serializers.ChoiceField(choices=EVENTS), min_length=1, max_length=len(EVENTS)
    )
    secret = serializers.CharField(
        min_length=MIN_SECRET_CHARS,
        max_length=MAX_SECRET_CHARS,
        write_only=True,
        trim_whitespace=False,
        help_text="Signs every body (X-Fleet-Signature: sha256=HMAC of '<timestamp>.<body>'); "
        "never returned.",
    )
    format = serializers.ChoiceField(choices=AlertFormat.choices, default=AlertFormat.FLEET)
    enabled = serializers.BooleanField(default=True)


class DeliverySerializer(serializers.ModelSerializer[AlertDelivery]):
    class Meta:
        model = AlertDelivery
        fields = [
            "id",
            "webhook",
            "event",
            "status",
            "attempts",
            "response_code",
            "last_error",
            "next_attempt_at",
            "last_attempt_at",
            "delivered_at",
            "created_at",
            "payload",
        ]
        read_only_fields = fields
