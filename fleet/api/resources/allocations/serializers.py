"""Allocations (replicas): the replica as the API shows it, the move body, its metrics and its
logs."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.allocations.accounting.telemetry import MAX_POINTS, WINDOWS
from fleet.allocations.environment import allocation_environment
from fleet.allocations.models import Allocation
from fleet.allocations.ports import allocation_address, allocation_ports, allocation_ready
from fleet.allocations.workloads import workload_of
from fleet.api.fields import IdField
from fleet.api.permissions import reader_sees_spec
from fleet.api.resources.workloads.serializers import WorkloadReadSerializer
from fleet.core.redaction import workload_redacted
from hostagent import protocol


class AllocationSerializer(serializers.ModelSerializer[Allocation]):
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    workload = serializers.SerializerMethodField()
    message = serializers.CharField(
        source="workload_message", read_only=True, help_text="The agent's word on the workload."
    )
    environment = serializers.SerializerMethodField()
    ports = serializers.SerializerMethodField()
    address = serializers.SerializerMethodField()
    ready = serializers.SerializerMethodField()

    @extend_schema_field(
        serializers.DictField(
            child=serializers.IntegerField(min_value=1, max_value=65535),
            help_text="The replica's host port per declared port name, as its agent reported "
            "it (`{}`: none yet, or the workload declares none).",
        )
    )
    def get_ports(self, obj: Allocation) -> dict[str, int]:
        return allocation_ports(obj)

    @extend_schema_field(
        serializers.CharField(
            allow_null=True,
            help_text="`host:port` of its first declared port: the host's address (its "
            "agent's `--address`) and the replica's host port; null while either is unknown.",
        )
    )
    def get_address(self, obj: Allocation) -> str | None:
        return allocation_address(obj)

    @extend_schema_field(
        serializers.BooleanField(
            help_text="It serves: its workload is `running` (its health check passed, or it "
            "has none) on a host that is not offline."
        )
    )
    def get_ready(self, obj: Allocation) -> bool:
        return allocation_ready(obj)

    @extend_schema_field(
        serializers.DictField(
            child=serializers.CharField(),
            help_text="CUDA_VISIBLE_DEVICES and, for MPS shares, the CUDA_MPS_* limits and pipe.",
        )
    )
    def get_environment(self, obj: Allocation) -> dict[str, str]:
        return allocation_environment(obj)

    @extend_schema_field(
        WorkloadReadSerializer(
            help_text="What this copy runs (a rolling update's new copies run the new version); "
            "another team's: its runtime only (`redacted`)."
        )
    )
    def get_workload(self, obj: Allocation) -> Any:
        workload = workload_of(obj.deployment, obj)
        if not reader_sees_spec(self.context, obj.deployment.team_id):
            return workload_redacted(workload)
        return {"image_pin": None, **workload, "redacted": False}  # as WorkloadReadSerializer

    class Meta:
        model = Allocation
        fields = [
            "id",
            "deployment",
            "deployment_name",
            "replica",
            "gpu_slot",
            "kind",
            "gpu",
            "partition",
            "memory_mib",
            "compute_percent",
            "state",
            "generation",
            "environment",
            "workload",
            "workload_state",
            "started_at",
            "exit_code",
            "restarts",
            "message",
            "ports",
            "address",
            "ready",
            "replaces",
            "borrowed",
            "created_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "replaces": {
                "help_text": "A move's new copy: the allocation it replaces once it runs (null "
                "otherwise)."
            },
            "borrowed": {
                "help_text": "Placed past its team's deserved share, on capacity no other "
                "team's deserved share needed then (docs/sharing.md); a move keeps the mark."
            },
        }


class MoveRequestSerializer(serializers.Serializer[Any]):
    partition = IdField(required=False)
    gpu = IdField(required=False)
    start = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=7,
        help_text="On a MIG GPU without a free partition of the profile: where to create one.",
    )
    timeout_s = serializers.IntegerField(
        required=False,
        min_value=10,
        max_value=3600,
        help_text="How long the new copy has to run before the move is rolled back.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("partition" in attrs) == ("gpu" in attrs):
            raise serializers.ValidationError("Give exactly one of 'partition' or 'gpu'.")
        return attrs


class ReplicaMetricsQuerySerializer(serializers.Serializer[Any]):
    window = serializers.ChoiceField(
        choices=list(WINDOWS),
        default="1h",
        help_text="1h: 1 s points of the hot store; 24h and 7d: per-minute means. Each window is "
        f"cut into at most {MAX_POINTS} buckets.",
    )


class ReplicaPointSerializer(serializers.Serializer[Any]):
    ts = serializers.FloatField(help_text="Unix seconds, the start of the bucket.")
    utilization_percent = serializers.FloatField(
        allow_null=True,
        help_text="null where there is no value: a MIG instance without GPM (before Hopper), "
        "an MPS share (no per-client utilisation), no sample in the bucket.",
    )
    memory_used_mib = serializers.FloatField(
        allow_null=True, help_text="null where there is no value (no attributed process)."
    )


class ReplicaMetricsSerializer(serializers.Serializer[Any]):
    allocation = serializers.IntegerField()
    window = serializers.ChoiceField(choices=list(WINDOWS))
    bucket_s = serializers.IntegerField(help_text="Seconds each point's mean covers.")
    points = ReplicaPointSerializer(many=True)

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # ``source`` names a Field attribute too: declared here, not as a class attribute.
        fields = super().get_fields()
        fields["source"] = serializers.ChoiceField(
            choices=["mig_instance", "processes", "gpu"],
            help_text="Where the values come from: the replica's MIG instance; the memory of "
            "the processes the agent attributes to it (MPS); for a whole GPU, the GPU's "
            "utilisation and its processes' memory.",
        )
        return fields


class LogsQuerySerializer(serializers.Serializer[Any]):
    tail = serializers.IntegerField(
        min_value=1, max_value=protocol.MAX_LOG_LINES, default=protocol.DEFAULT_LOG_LINES
    )
    before = serializers.IntegerField(min_value=1, max_value=protocol.MAX_LOG_SEQ, default=None)
    q = serializers.CharField(
        max_length=protocol.MAX_LOG_QUERY, allow_blank=True, trim_whitespace=False, default=""
    )
    download = serializers.BooleanField(default=False)

    def validate_q(self, value: str) -> str:
        if "\0" in value:
            raise serializers.ValidationError("A search cannot contain a NUL character.")
        return value


class LogsSerializer(serializers.Serializer[Any]):
    lines = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        help_text="The newest lines of the replica's output (stdout and stderr), oldest first.",
    )
    truncated = serializers.BooleanField(
        help_text="More output exists than was returned, or lines were cut (4 KiB a line, "
        "512 KiB in all)."
    )
    error = serializers.CharField(
        allow_null=True,
        help_text="Why the agent has no lines (no output yet, the replica is not on its host), "
        "else null.",
    )
    timestamps = serializers.ListField(
        child=serializers.DateTimeField(allow_null=True),
        help_text="When the agent captured each line (one per line, ISO 8601, UTC); null where "
        "not known: lines the agent found already written, or an agent of an older release.",
    )
    cursors = serializers.ListField(
        child=serializers.IntegerField(),
        allow_null=True,
        help_text="Each line's cursor (one per line, increasing): pass the first as `before` "
        "for the lines older than these. Null when this output cannot be paged (a container's, "
        "or an older agent's).",
    )
    older_gone = serializers.BooleanField(
        help_text="Older output existed but the agent no longer keeps it (its ring holds the "
        "newest 20,000 lines, 2 MiB): no `before` reaches it."
    )
