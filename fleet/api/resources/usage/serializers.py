"""``GET /usage``: its query and its answer."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.allocations.accounting.usage import GROUPS

UNIT_HELP = {
    "mig_slice_hours": "MIG compute-slice-hours (a 3g profile for 2 h: 6).",
    "mps_gib_hours": "MPS reserved GiB-hours.",
    "mps_compute_percent_hours": "MPS compute-cap-%-hours (uncapped shares add none).",
    "gpu_hours": "Whole-GPU-hours.",
    "gpu_equivalent_hours": (
        "GPU-equivalent hours: a MIG slice's share of its GPU's compute slices, an MPS share's "
        "larger of memory and compute share (uncapped: its memory share), a whole GPU 1."
    ),
    "borrowed_gpu_equivalent_hours": (
        "The part of `gpu_equivalent_hours` held by borrowed replicas (past their team's "
        "deserved share); the rest is guaranteed."
    ),
}


class UsageQuerySerializer(serializers.Serializer[Any]):
    # ``from`` is a keyword: declared below under its query name.
    to = serializers.DateTimeField(
        required=False, help_text="Window end (ISO 8601, UTC when no offset); default now."
    )
    group_by = serializers.ChoiceField(choices=list(GROUPS), required=False, default="team")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField(
            required=False,
            help_text="Window start (ISO 8601, UTC when no offset); default 24 h before `to`. "
            "At most 400 days before `to`.",
        )
        return fields


class UsageUnitsSerializer(serializers.Serializer[Any]):
    mig_slice_hours = serializers.FloatField(help_text=UNIT_HELP["mig_slice_hours"])
    mps_gib_hours = serializers.FloatField(help_text=UNIT_HELP["mps_gib_hours"])
    mps_compute_percent_hours = serializers.FloatField(
        help_text=UNIT_HELP["mps_compute_percent_hours"]
    )
    gpu_hours = serializers.FloatField(help_text=UNIT_HELP["gpu_hours"])
    gpu_equivalent_hours = serializers.FloatField(help_text=UNIT_HELP["gpu_equivalent_hours"])
    borrowed_gpu_equivalent_hours = serializers.FloatField(
        help_text=UNIT_HELP["borrowed_gpu_equivalent_hours"]
    )


class UsageGroupSerializer(serializers.Serializer[Any]):
    key = serializers.CharField(
        allow_null=True,
        help_text="The team or deployment id (as a string), or the product key.",
    )
    name = serializers.CharField(help_text="Its name when the usage was recorded.")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {**super().get_fields(), **UsageUnitsSerializer().get_fields()}


class UsageReportSerializer(serializers.Serializer[Any]):
    to = serializers.DateTimeField()
    group_by = serializers.ChoiceField(choices=list(GROUPS))
    groups = UsageGroupSerializer(many=True, help_text="Largest GPU-equivalent hours first.")
    totals = UsageUnitsSerializer()

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {"from": serializers.DateTimeField(), **super().get_fields()}
