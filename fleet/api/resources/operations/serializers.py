"""Operations: the audit trail, as the API shows it (credentials and other teams' specs out)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.api.permissions import reader_sees_spec
from fleet.core.models import Operation
from fleet.core.redaction import payload_redacted, urls_redacted


class OperationSerializer(serializers.ModelSerializer[Operation]):
    # The username at the time (kept when the user is deleted); null: the system.
    requested_by = serializers.SerializerMethodField()

    class Meta:
        model = Operation
        fields = [
            "id",
            "kind",
            "status",
            "summary",
            "requested_by",
            "host",
            "gpu",
            "deployment",
            "generation",
            "payload",
            "result",
            "reason",
            "created_at",
            "dispatched_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "nullable": True})
    def get_requested_by(self, operation: Operation) -> str | None:
        return operation.requested_by_name or None

    def to_representation(self, instance: Operation) -> Any:
        """URLs without credentials or query strings (a webhook's, in its summary); another
        team's workload specs out of the payload (a rollout's ``workload`` and ``previous``)."""
        data = super().to_representation(instance)
        data["summary"] = urls_redacted(data["summary"] or "")
        data["reason"] = urls_redacted(data["reason"] or "")
        payload = data["payload"]
        if payload_redacted(payload) is not payload:  # it holds a spec: whose is it?
            team_id = instance.deployment.team_id if instance.deployment is not None else None
            if not reader_sees_spec(self.context, team_id):
                data["payload"] = payload_redacted(payload)
        return data
