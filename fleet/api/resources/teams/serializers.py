"""Teams: the team with its members, quota and usage, and the bodies that set them."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.fields import BoundedDictField, BoundedListField, IdField
from fleet.core.models import TeamRole
from fleet.core.teams import (
    MAX_MEMBERS,
    MAX_PROFILES,
    MAX_WEIGHT,
)


class MemberSerializer(serializers.Serializer[Any]):
    user = IdField()
    username = serializers.CharField(read_only=True)
    role = serializers.ChoiceField(choices=TeamRole.choices)


class LimitSerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField(allow_null=True, required=False, help_text="Whole GPUs.")
    mig_compute_slices = serializers.IntegerField(
        allow_null=True, required=False, help_text="Compute slices of the team's MIG replicas."
    )
    mps_memory_mib = serializers.IntegerField(
        allow_null=True, required=False, help_text="GPU memory of the team's MPS replicas."
    )
    mig_profiles = BoundedDictField(
        max_entries=MAX_PROFILES,
        child=serializers.IntegerField(),
        required=False,
        help_text='Replicas per MIG profile, e.g. `{"1g.10gb": 8}`; profiles not listed: free.',
    )


class QuotaSerializer(LimitSerializer):
    """The deserved share: the four kinds at the top, as before this model (an old body still
    sets them), plus the most the team may hold, borrowing included, and its weight."""

    limit = LimitSerializer(
        required=False,
        allow_null=True,
        help_text="The most the team may hold, borrowed replicas included; a kind with no limit "
        "is capped by its deserved share (no borrowing of it). `null` lifts every limit.",
    )
    over_quota_weight = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_WEIGHT,
        help_text="The queue compares teams by their use divided by this weight (default 1).",
    )


class UsageSerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField()
    mig_compute_slices = serializers.IntegerField()
    mps_memory_mib = serializers.IntegerField()
    mig_profiles = serializers.DictField(child=serializers.IntegerField())


class TeamSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=100)
    slug = serializers.CharField(max_length=100, required=False)
    members = MemberSerializer(many=True, read_only=True)
    quota = QuotaSerializer(read_only=True, help_text="`null`: no limit.")
    usage = UsageSerializer(read_only=True, help_text="What the team's replicas hold now.")
    deployments = serializers.IntegerField(read_only=True)
    default_priority = serializers.CharField(
        max_length=32,
        required=False,
        allow_blank=True,
        help_text="The priority class of its deployments that name none (`GET /priorities/`); "
        '`""`: none.',
    )


class MembersSerializer(serializers.Serializer[Any]):
    members = BoundedListField(child=MemberSerializer(), max_length=MAX_MEMBERS)
