"""Serializers of MIG layouts, MPS policies, profile references, rule violations and the MIG
catalog."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.api.fields import BoundedListField, IdField
from fleet.inventory.models import SharingMode
from fleet.mig.migparted.parse import MAX_TEXT_CHARS
from fleet.mps import MAX_CLIENTS_PER_GPU, MAX_COMPUTE_PERCENT


class ViolationSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


class MpsPolicySerializer(serializers.Serializer[Any]):
    default_active_thread_percentage = serializers.IntegerField(
        default=MAX_COMPUTE_PERCENT, min_value=1, max_value=MAX_COMPUTE_PERCENT
    )
    default_pinned_mem_limit_mib = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=10_000_000
    )
    max_clients = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_CLIENTS_PER_GPU
    )


@extend_schema_field(
    {
        "oneOf": [{"type": "integer", "minimum": 0, "maximum": 255}, {"type": "string"}],
        "description": "NVML profile id (`9`, an integer end to end) or profile name (`3g.40gb`).",
    }
)
class ProfileRefField(serializers.Field[int | str, int | str, int | str, Any]):
    """A MIG profile reference: an NVML profile id as an integer, or a profile name. A string of
    digits is an id too (older clients sent ids as strings)."""

    default_error_messages = {"invalid": "Expected a profile id (0-255) or a profile name."}

    def to_internal_value(self, data: Any) -> int | str:
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, str) and data.strip().isdecimal():
            data = int(data.strip())
        if isinstance(data, int):
            if not 0 <= data <= 255:
                self.fail("invalid")
            return data
        if isinstance(data, str) and 0 < len(data.strip()) <= 32:
            return data.strip()
        self.fail("invalid")
        raise AssertionError("unreachable")  # fail() raises

    def to_representation(self, value: int | str) -> int | str:
        return value


class MigInstanceInputSerializer(serializers.Serializer[Any]):
    profile = ProfileRefField()
    start = serializers.IntegerField(
        min_value=0, max_value=63, help_text="First memory slice of the placement."
    )
    mps = MpsPolicySerializer(
        required=False, allow_null=True, help_text="Run an MPS daemon inside this instance."
    )


class LayoutSerializer(serializers.Serializer[Any]):
    mode = serializers.ChoiceField(choices=SharingMode.choices)
    instances = BoundedListField(child=MigInstanceInputSerializer(), required=False, max_length=16)
    mps = MpsPolicySerializer(required=False, allow_null=True)


class MigValidateSerializer(serializers.Serializer[Any]):
    product = serializers.CharField(
        required=False, max_length=128, help_text="NVML product name, catalog key or PCI device id."
    )
    gpu = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="Validate for this GPU (uses its reported placements).",
    )
    instances = BoundedListField(child=MigInstanceInputSerializer(), max_length=16)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("product" in attrs) == ("gpu" in attrs):
            raise serializers.ValidationError("Give exactly one of 'product' or 'gpu'.")
        return attrs


class PlacementOutSerializer(serializers.Serializer[Any]):
    profile = serializers.CharField()
    profile_id = serializers.IntegerField()
    start = serializers.IntegerField()
    size = serializers.IntegerField()


class MigValidateResultSerializer(serializers.Serializer[Any]):
    valid = serializers.BooleanField()
    product = serializers.CharField()
    placements = PlacementOutSerializer(many=True)
    violations = ViolationSerializer(many=True)


class CatalogProfileSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    compute_slices = serializers.IntegerField()
    memory_slices = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    max_instances = serializers.IntegerField()
    media = serializers.CharField()
    placements = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField())
    )


class CatalogProductSerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    name = serializers.CharField()
    aliases = serializers.ListField(child=serializers.CharField())
    pci_device_ids = serializers.ListField(child=serializers.CharField())
    memory_mib = serializers.IntegerField()
    mig_capable = serializers.BooleanField()
    memory_slice_count = serializers.IntegerField()
    compute_slice_count = serializers.IntegerField()
    max_instances = serializers.IntegerField()
    profiles = CatalogProfileSerializer(many=True)


class MigPartedImportSerializer(serializers.Serializer[Any]):
    yaml = serializers.CharField(
        max_length=MAX_TEXT_CHARS,
        help_text="An nvidia-mig-parted config file (version v1), without YAML anchors or aliases.",
    )
    config = serializers.CharField(max_length=200, help_text="The config name (`apply -c NAME`).")
    gpu = IdField(help_text="The GPU the layout is for.")


class MigPartedLayoutSerializer(serializers.Serializer[Any]):
    valid = serializers.BooleanField()
    layout = LayoutSerializer(allow_null=True, help_text="Ready for `PUT /gpus/{id}/layout`.")
    violations = ViolationSerializer(many=True)
