"""API tokens: a token as listed, the body that creates one, and the answer that shows it once."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.core.models import ApiToken
from fleet.core.services import MAX_TOKEN_DAYS


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    prefix = serializers.CharField(
        read_only=True,
        help_text="The token's public part (`fla_<prefix>_…`); empty on some older tokens: "
        "tell those apart by id and created_at.",
    )
    expires_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Refused from this time on; null: never."
    )

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "last_used_at"]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_TOKEN_DAYS,
        help_text="The token stops working after this many days; omit or null: never.",
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its hash is kept.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields
