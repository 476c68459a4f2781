"""Layout rollouts: the body that starts one (a selector and a layout, layouts or a mig-parted
config) and the answer of its dry run."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.fields import BoundedDictField, BoundedListField, IdField
from fleet.api.resources.mig.serializers import LayoutSerializer
from fleet.inventory.labels import MAX_LABELS


class SelectorSerializer(serializers.Serializer[Any]):
    product = serializers.CharField(
        required=False, allow_blank=True, max_length=128, help_text="NVML name or catalog key."
    )
    labels = BoundedDictField(
        max_entries=MAX_LABELS,
        child=serializers.CharField(max_length=63),
        required=False,
        help_text="Host labels every selected GPU's host carries.",
    )
    hosts = BoundedListField(child=IdField(), required=False, max_length=1000)
    gpus = BoundedListField(child=IdField(), required=False, max_length=1000)


class GpuLayoutSerializer(serializers.Serializer[Any]):
    gpu = IdField()
    layout = LayoutSerializer()


class MigPartedSourceSerializer(serializers.Serializer[Any]):
    config = serializers.JSONField(
        help_text="The mig-parted config: YAML or JSON text, or the document as an object."
    )
    name = serializers.CharField(
        max_length=256, help_text="The config name (`nvidia-mig-parted apply -c NAME`)."
    )

    def validate_config(self, value: Any) -> Any:
        if not isinstance(value, str | dict):
            raise serializers.ValidationError("Give the config as text or as an object.")
        return value


class LayoutRolloutSerializer(serializers.Serializer[Any]):
    selector = SelectorSerializer()
    layout = LayoutSerializer(required=False, help_text="One layout for every selected GPU.")
    layouts = BoundedListField(
        child=GpuLayoutSerializer(),
        required=False,
        max_length=1000,
        help_text="A layout per GPU (each a GPU the selector picks; the others are left alone).",
    )
    migparted = MigPartedSourceSerializer(
        required=False,
        help_text="A mig-parted config: each selected GPU takes its entry's layout.",
    )
    max_unavailable = serializers.IntegerField(default=1, min_value=1, max_value=64)
    timeout_s = serializers.IntegerField(
        default=600, min_value=30, max_value=86_400, help_text="Each GPU's drain deadline."
    )
    dry_run = serializers.BooleanField(default=False)
    place_waiting = BoundedListField(
        child=IdField(),
        required=False,
        max_length=1000,
        help_text="Deployments whose unplaced replicas the engine places once every GPU is "
        "reshaped (the layout advisor's proposal names them).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [key for key in ("layout", "layouts", "migparted") if key in attrs]
        if len(given) != 1:
            raise serializers.ValidationError(
                "Give exactly one of 'layout', 'layouts' or 'migparted'."
            )
        gpus = [entry["gpu"] for entry in attrs.get("layouts", ())]
        if len(gpus) != len(set(gpus)):
            raise serializers.ValidationError({"layouts": "Each GPU may appear once."})
        return attrs


class DryRunSerializer(serializers.Serializer[Any]):
    gpus = serializers.ListField(child=serializers.DictField())
    problems = serializers.ListField(child=serializers.CharField())
    replicas_to_move = serializers.IntegerField()
    replicas_without_room = serializers.IntegerField()
