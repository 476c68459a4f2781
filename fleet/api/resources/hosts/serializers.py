"""Hosts: the host as the API shows it, and the bodies of its commands (create, labels,
reservation, drain, token rotation)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.agents.versions import agent_problem
from fleet.allocations.maintenance import scheduled_drains
from fleet.api.fields import BoundedListField, LabelsField, TeamRefField
from fleet.inventory.models import Host
from fleet.inventory.reservations import MAX_RESERVED_TEAMS


class HostDrainInfoSerializer(serializers.Serializer[Any]):
    operation = serializers.IntegerField()
    status = serializers.CharField(help_text="`pending` while scheduled, `dispatched` running.")
    step = serializers.CharField()
    at = serializers.DateTimeField(help_text="When it starts (or started).")


class HostSerializer(serializers.ModelSerializer[Host]):
    gpu_count = serializers.IntegerField(read_only=True)
    drain = serializers.SerializerMethodField()
    reserved_for = serializers.SerializerMethodField()
    agent_problem = serializers.SerializerMethodField(
        help_text="Why this server does not serve the host's agent and what to upgrade (its "
        "protocol is older than the one before the server's, or newer than the server's); "
        "empty when it is served."
    )

    class Meta:
        model = Host
        fields = [
            "id",
            "name",
            "hostname",
            "status",
            "labels",
            "reserved_for",
            "drain",
            "runtime",
            "agent_version",
            "agent_protocol",
            "agent_problem",
            "driver_version",
            "nvml_version",
            "last_seen_at",
            "token_expires_at",
            "desired_generation",
            "applied_generation",
            "dispatched_generation",
            "gpu_count",
            "created_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "agent_protocol": {
                "help_text": "The agent protocol the host's agent speaks (its hello); 0: it "
                "has not said yet. The server serves its own protocol and the one before."
            },
            "token_expires_at": {
                "help_text": "When the agent's host token expires (it is renewed over the "
                "agent's connection before that); null: not enrolled, revoked, or a token from "
                "before tokens expired (renewed at the agent's next connection)."
            },
        }

    def get_agent_problem(self, obj: Host) -> str:
        return agent_problem(obj)

    @extend_schema_field(
        serializers.ListField(
            child=serializers.CharField(),
            help_text="The slugs of the teams the host is reserved for: only their "
            "deployments' replicas are placed on it (`placement.host_reserved`); empty: every "
            "team's. Set with `PUT /hosts/{id}/reservation` (admins).",
        )
    )
    def get_reserved_for(self, obj: Host) -> list[str]:
        return sorted(team.slug for team in obj.reserved_for.all())

    @extend_schema_field(
        HostDrainInfoSerializer(
            allow_null=True, help_text="The host's drain, scheduled or running; null: none."
        )
    )
    def get_drain(self, obj: Host) -> dict[str, Any] | None:
        drains = self.context.get("drains")
        if drains is None:
            drains = scheduled_drains([obj.pk])
        operation = drains.get(obj.pk)
        if operation is None:
            return None
        return {
            "operation": operation.pk,
            "status": operation.status,
            "step": operation.payload.get("step", ""),
            "at": operation.payload.get("at"),
        }


class HostCreateSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", max_length=200)
    labels = LabelsField(required=False)


class HostUpdateSerializer(serializers.Serializer[Any]):
    labels = LabelsField(help_text="The host's labels, replacing the current ones.")


class HostReservationSerializer(serializers.Serializer[Any]):
    teams = BoundedListField(
        child=TeamRefField(),
        max_length=MAX_RESERVED_TEAMS,
        help_text="The teams (ids or slugs) whose deployments alone may place replicas on the "
        "host; `[]` lifts the reservation.",
    )


class HostDrainSerializer(serializers.Serializer[Any]):
    at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        help_text="Start the drain at this time (in the future, at most 30 days ahead); "
        "absent: now.",
    )
    force = serializers.BooleanField(
        default=False,
        help_text="Stop (evict) the replicas that have nowhere to go instead of reporting them.",
    )
    timeout_s = serializers.FloatField(
        default=1800.0,
        min_value=10.0,
        max_value=86400.0,
        help_text="How long the moves may take once the drain starts.",
    )


class HostCreatedSerializer(HostSerializer):
    enrollment_token = serializers.CharField(
        read_only=True, help_text="Shown once. Give it to the agent."
    )

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "enrollment_token"]
        read_only_fields = fields


class HostRotateTokenQuerySerializer(serializers.Serializer[Any]):
    revoke = serializers.BooleanField(
        default=False,
        help_text="true: the old token is refused at once and the host's sockets are closed "
        "(a token thought compromised); the new one is not pushed to the agent.",
    )


class HostTokenRotatedSerializer(HostSerializer):
    token = serializers.CharField(
        read_only=True,
        help_text="The new host token. Shown once: a connected agent already has it; "
        "otherwise put it in the agent's token file.",
    )

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "previous_token_expires_at", "token"]
        read_only_fields = fields
        extra_kwargs = {
            **HostSerializer.Meta.extra_kwargs,
            "previous_token_expires_at": {
                "help_text": "Until when the old token is still accepted (unless the agent uses "
                "the new one first); null: not at all (`revoke=true`)."
            },
        }
