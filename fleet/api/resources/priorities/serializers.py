"""Priority classes: a name, its value (higher is served first) and a description."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class PriorityClassSerializer(serializers.Serializer[Any]):
    name = serializers.SlugField(max_length=32, help_text="Its key; it never changes.")
    value = serializers.IntegerField(help_text="Higher is served first; unique.")
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
