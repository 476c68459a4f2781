"""``GET /allocations/{id}/what-would-it-take``: the ranked plans that would place a waiting
replica (:mod:`fleet.sharing.wit`)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class PlanRequestSerializer(serializers.Serializer[Any]):
    method = serializers.ChoiceField(choices=["GET", "POST", "PUT", "PATCH", "DELETE"])
    path = serializers.CharField(help_text="Under `/api/v1`.")
    body = serializers.JSONField(allow_null=True, help_text="The exact JSON body (`null`: none).")
    after = serializers.ChoiceField(
        choices=["", "operation", "released"],
        help_text="What to wait for once the request before it answered: `operation` (the "
        "operation it started has succeeded), `released` (the replicas it stopped have given "
        'back their slices), `""` nothing.',
    )


class PlanSerializer(serializers.Serializer[Any]):
    rank = serializers.IntegerField(help_text="1 is the smallest action.")
    kind = serializers.ChoiceField(
        choices=["place", "moves", "reshape", "quota", "stop", "wait"],
        help_text="`place`: it fits now; `moves`: other replicas move (make before break); "
        "`reshape`: a GPU's MIG layout changes; `quota`: its team's quota changes; `stop`: "
        "borrowed replicas of other teams stop (they wait again); `wait`: when it fits with "
        "nobody acting, as far as Fleet knows.",
    )
    summary = serializers.CharField()
    requests = PlanRequestSerializer(many=True, help_text="Sent in order, they apply the plan.")
    moved = serializers.IntegerField(help_text="Running replicas moved.")
    stopped = serializers.IntegerField(help_text="Running replicas stopped.")
    reshaped = serializers.IntegerField(help_text="GPUs whose MIG layout changes.")
    changes_policy = serializers.BooleanField(help_text="It changes a team's quota.")
    destructive = serializers.BooleanField(
        help_text="It moves or stops someone's replica, or reshapes a GPU: confirm first."
    )
    role = serializers.CharField(
        help_text='Who may apply it: `team_operator`, `operator`, `admin` (`""`: nothing to apply).'
    )
    may_apply = serializers.BooleanField(help_text="Whether the caller's role may apply it.")
    proof = serializers.DictField(
        help_text="Why no smaller plan of its kind exists: `bound` (no plan moves fewer), "
        "`method` (`exhaustive`, `cp-sat`, `greedy`, `reclaim`), `status`, `claim`."
    )
    details = serializers.DictField(
        help_text="What it names: moves, stops, GPUs, the quota raised, or (`wait`) `when` "
        "(`now`, `rollout`, `releases`, `unknown`) and `at` (a time, or `null`: unknown)."
    )


class InProgressSerializer(serializers.Serializer[Any]):
    operation = serializers.IntegerField(help_text="The operation placing it (follow it).")
    kind = serializers.ChoiceField(choices=["defrag", "reclaim"])
    requested_by = serializers.CharField(
        allow_null=True, help_text="Who started it; `null`: Fleet itself (beat)."
    )


class WhatWouldItTakeSerializer(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="The waiting replica: `DEPLOYMENT.REPLICA`.")
    deployment = serializers.IntegerField()
    deployment_name = serializers.CharField()
    replica = serializers.IntegerField()
    team = serializers.IntegerField()
    team_name = serializers.CharField()
    blocked_by = serializers.ChoiceField(
        choices=["none", "capacity", "quota"],
        help_text="`quota`: its team's quota or limit (`quota_reasons`); `capacity`: no GPU "
        "has room; `none`: it fits now.",
    )
    quota_reasons = serializers.ListField(child=serializers.DictField())
    in_progress = InProgressSerializer(
        allow_null=True,
        help_text="A defrag or reclaim running now that places its next replica (the head of "
        "the queue's moves, carried out by Fleet; a reclaim; an operator's): no plan needs "
        "applying meanwhile.",
    )
    plans = PlanSerializer(many=True, help_text="Smallest first; `wait` last.")
    cached = serializers.BooleanField(
        help_text="Answered from the background refresh's cache (else computed now)."
    )
    fingerprint = serializers.CharField(help_text="The fleet state the answer holds for.")
    computed_at = serializers.DateTimeField()
    compute_ms = serializers.FloatField(help_text="How long computing the answer took.")
