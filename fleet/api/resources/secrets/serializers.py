"""A team's secrets: names, versions and who set them; a value is written and never read back."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.core.secrets import MAX_VALUE_CHARS, NAME_RULE


class SecretSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(help_text=f"{NAME_RULE[0].upper()}{NAME_RULE[1:]}.")
    version = serializers.IntegerField(help_text="1, then one more with each new value.")
    updated_by = serializers.CharField(allow_null=True, help_text="Who set the current value.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class SecretCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(
        max_length=100, help_text=f"{NAME_RULE[0].upper()}{NAME_RULE[1:]}."
    )
    value = serializers.CharField(
        max_length=MAX_VALUE_CHARS,
        write_only=True,
        trim_whitespace=False,
        help_text=f"1 to {MAX_VALUE_CHARS} characters, no NUL; never shown again.",
    )


class SecretUpdateSerializer(serializers.Serializer[Any]):
    value = serializers.CharField(
        max_length=MAX_VALUE_CHARS, write_only=True, trim_whitespace=False
    )
    roll = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Start a rolling update of every deployment of the team that refers to the "
        "secret, so that each replica gets the new value (else running replicas keep the value "
        "they started with until they restart or move).",
    )


class SecretRolloutSerializer(serializers.Serializer[Any]):
    deployment = serializers.IntegerField()
    operation = serializers.IntegerField(help_text="The `rollout` operation.")


class SecretSkippedSerializer(serializers.Serializer[Any]):
    deployment = serializers.IntegerField()
    reason = serializers.CharField()


class SecretSetSerializer(SecretSerializer):
    rollouts = SecretRolloutSerializer(many=True, help_text="The rolling updates started.")
    skipped = SecretSkippedSerializer(
        many=True, help_text="Deployments that refer to it and could not roll now, and why."
    )
