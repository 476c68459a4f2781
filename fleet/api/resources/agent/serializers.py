"""The agent's REST bodies: enrolment, and a report of up-messages (each checked by
:mod:`fleet.agents.guard` against ``hostagent.protocol``)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.fields import BoundedDictField, BoundedListField


class AgentEnrollRequestSerializer(serializers.Serializer[Any]):
    enrollment_token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=255)


class AgentEnrollResponseSerializer(serializers.Serializer[Any]):
    host_id = serializers.IntegerField()
    token = serializers.CharField()


class AgentReportSerializer(serializers.Serializer[Any]):
    messages = BoundedListField(child=BoundedDictField(max_entries=64), max_length=1000)


class AgentHostTokenSerializer(serializers.Serializer[Any]):
    type = serializers.ChoiceField(choices=["host_token"])
    token = serializers.CharField()
    expires_at = serializers.FloatField(help_text="Unix seconds.")


class AgentReportAcceptedSerializer(serializers.Serializer[Any]):
    accepted = serializers.IntegerField()
    host_token = AgentHostTokenSerializer(
        required=False,
        help_text="Only when the host token was renewed: a `host_token` message "
        "(hostagent.protocol) with the new token, to be used from the next request on. The old "
        "one is accepted until the new one is used, for a day at most.",
    )
