"""Placing a deployment's replicas: the place and evict bodies, the drag-and-drop preview
(targets), place-all's answer and the defragmentation plan."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.fields import IdField
from fleet.api.resources.mig.serializers import ViolationSerializer
from fleet.api.resources.operations.serializers import OperationSerializer


class PlaceSerializer(serializers.Serializer[Any]):
    partition = IdField(required=False)
    gpu = IdField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("partition" in attrs) == ("gpu" in attrs):
            raise serializers.ValidationError("Give exactly one of 'partition' or 'gpu'.")
        return attrs


class EvictSerializer(serializers.Serializer[Any]):
    replica = serializers.IntegerField(required=False, min_value=0, max_value=999)


class NewInstanceSerializer(serializers.Serializer[Any]):
    profile_id = serializers.IntegerField()
    start = serializers.IntegerField()


class FeasibleTargetSerializer(serializers.Serializer[Any]):
    gpu = serializers.IntegerField()
    partition = serializers.IntegerField(allow_null=True)
    gpus = serializers.ListField(child=serializers.IntegerField())
    score = serializers.FloatField()
    new_instance = NewInstanceSerializer(allow_null=True)


class InfeasibleTargetSerializer(serializers.Serializer[Any]):
    gpu = serializers.IntegerField()
    partition = serializers.IntegerField(allow_null=True)
    violations = ViolationSerializer(many=True)


class TargetsSerializer(serializers.Serializer[Any]):
    deployment = serializers.IntegerField()
    strategy = serializers.CharField()
    quota = ViolationSerializer(
        many=True,
        help_text="The team's limits the next replica would pass (`quota.exceeded`); not empty: "
        "every target refuses it.",
    )
    feasible = FeasibleTargetSerializer(many=True)
    infeasible = InfeasibleTargetSerializer(many=True)


class PlaceAllSerializer(serializers.Serializer[Any]):
    deployment = serializers.IntegerField()
    placed = OperationSerializer(many=True)
    unplaced = serializers.IntegerField(help_text="Replicas still unplaced.")
    reasons = ViolationSerializer(
        many=True, help_text="Why they do not fit now; `details.refusals`: how many GPUs said so."
    )


class MoveSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=["mig", "mps"])
    allocation = serializers.IntegerField(
        allow_null=True, help_text="The replica that moves (null: an idle partition)."
    )
    partition = serializers.IntegerField(
        allow_null=True, help_text="MIG: the partition it leaves (or that is destroyed)."
    )
    from_gpu = serializers.IntegerField()
    to_gpu = serializers.IntegerField(
        allow_null=True, help_text="null: the idle partition is destroyed."
    )
    to_partition = serializers.IntegerField(allow_null=True)
    new_instance = NewInstanceSerializer(allow_null=True)


class DefragPlanSerializer(serializers.Serializer[Any]):
    deployment = serializers.IntegerField()
    fits_now = serializers.BooleanField()
    moves = MoveSerializer(many=True)
    target = FeasibleTargetSerializer(
        allow_null=True, help_text="Where the replica fits after the moves."
    )
