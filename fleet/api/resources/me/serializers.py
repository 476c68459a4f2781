"""The authenticated user."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class MeSerializer(serializers.Serializer[Any]):
    username = serializers.CharField()
    role = serializers.CharField()
