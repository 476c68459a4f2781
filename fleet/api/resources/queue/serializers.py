"""``GET /queue/``: the waiting replicas in the order they are served."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class ReasonSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(
        help_text="`quota.exceeded` / `quota.borrow_unavailable` (its team's quota or limit, or "
        "borrowing what another team's deserved share waits for), `queue.fits_now`, or the "
        "placement engine's main reason nothing fits."
    )
    message = serializers.CharField()
    details = serializers.DictField()


class QueuedReplicaSerializer(serializers.Serializer[Any]):
    id = serializers.CharField(
        help_text="`DEPLOYMENT.REPLICA`: the id `GET /allocations/{id}/what-would-it-take` takes."
    )
    position = serializers.IntegerField(help_text="1 is served first.")
    deployment = serializers.IntegerField()
    deployment_name = serializers.CharField()
    replica = serializers.IntegerField()
    team = serializers.IntegerField()
    team_name = serializers.CharField()
    priority = serializers.CharField(help_text='Its priority class (`""`: none, value 0).')
    priority_value = serializers.IntegerField()
    team_share = serializers.FloatField(
        help_text="Its team's weighted share of decayed use when ordered (0 to 1, divided by "
        "the team's `over_quota_weight`)."
    )
    waiting_since = serializers.DateTimeField()
    reason = ReasonSerializer(help_text="What blocks it now.")


class QueueSerializer(serializers.Serializer[Any]):
    half_life_s = serializers.FloatField(help_text="`FLEET_FAIRSHARE_HALF_LIFE_S`.")
    waiting = QueuedReplicaSerializer(many=True, help_text="The first 1000, in order.")


class ReclaimMoveSerializer(serializers.Serializer[Any]):
    allocation = serializers.IntegerField(allow_null=True)
    deployment = serializers.IntegerField(allow_null=True)
    replica = serializers.IntegerField(allow_null=True)
    from_gpu = serializers.IntegerField()
    to_gpu = serializers.IntegerField(allow_null=True)


class ReclaimStopSerializer(serializers.Serializer[Any]):
    allocation = serializers.IntegerField()
    deployment = serializers.IntegerField()
    replica = serializers.IntegerField()
    team = serializers.IntegerField()
    gpu = serializers.IntegerField()


class ReclaimTargetSerializer(serializers.Serializer[Any]):
    gpu = serializers.IntegerField()
    partition = serializers.IntegerField(allow_null=True)


class ReclaimPlanSerializer(serializers.Serializer[Any]):
    action = serializers.ChoiceField(
        choices=["place", "move", "stop", "none"],
        help_text="`place`: it fits without touching anyone; `move`: borrowed replicas move "
        "first (make-before-break); `stop`: borrowed replicas stop (and wait again); `none`: "
        "nothing would place it, or it is not entitled (nothing is touched).",
    )
    code = serializers.CharField(help_text='`reclaim.not_entitled`, or `""`.')
    reason = serializers.CharField()
    target = ReclaimTargetSerializer(allow_null=True)
    moves = ReclaimMoveSerializer(many=True)
    stops = ReclaimStopSerializer(many=True)
