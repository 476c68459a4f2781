"""Prometheus' HTTP service discovery: a target group."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class TargetLabelsSerializer(serializers.Serializer[Any]):
    deployment = serializers.CharField()
    team = serializers.CharField(help_text="The team's slug.")
    replica = serializers.CharField(help_text="The replica's index, as a string.")
    gpu_uuid = serializers.CharField(help_text="Its (first) GPU's UUID.")
    profile = serializers.CharField(
        help_text="Its MIG profile (`3g.40gb`), or its kind (`mps`, `gpu`)."
    )
    host = serializers.CharField()


class TargetGroupSerializer(serializers.Serializer[Any]):
    targets = serializers.ListField(child=serializers.CharField(), help_text="`host:port`")
    labels = TargetLabelsSerializer()
