"""Output serializers (rows to JSON) and input serializers (JSON to service arguments)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from fleet.allocations.maintenance import scheduled_drains
from fleet.allocations.models import (
    Allocation,
    AllocationState,
    Deployment,
    RequestKind,
    WorkloadState,
)
from fleet.allocations.ports import allocation_address, allocation_ports, allocation_ready
from fleet.allocations.selectors import allocation_environment
from fleet.allocations.workloads import workload_of
from fleet.api.fields import BoundedDictField, BoundedListField, IdField
from fleet.api.serializers_endpoints import (
    EndpointReadSerializer,
    EndpointSerializer,
    endpoint_read,
)
from fleet.api.serializers_mig import LayoutSerializer, ViolationSerializer
from fleet.api.serializers_workloads import WorkloadSerializer
from fleet.core.filters import ID_MAX
from fleet.core.models import ApiToken, Operation
from fleet.core.redaction import payload_redacted, urls_redacted, workload_redacted
from fleet.core.services import MAX_TOKEN_DAYS
from fleet.core.teams import can_see_spec
from fleet.inventory.labels import MAX_LABELS, MAX_VALUE_CHARS, labels_problems
from fleet.inventory.models import Gpu, HealthEvent, Host
from fleet.inventory.reservations import MAX_RESERVED_TEAMS
from fleet.inventory.selectors import latest_telemetry_of
from fleet.partitioning.models import Partition


class ErrorSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `mig.overlap`.")
    message = serializers.CharField()
    details = serializers.DictField(
        help_text="Facts about the error; `violations` lists broken rules."
    )


class HostDrainInfoSerializer(serializers.Serializer[Any]):
    operation = serializers.IntegerField()
    status = serializers.CharField(help_text="`pending` while scheduled, `dispatched` running.")
    step = serializers.CharField()
    at = serializers.DateTimeField(help_text="When it starts (or started).")


class HostSerializer(serializers.ModelSerializer[Host]):
    gpu_count = serializers.IntegerField(read_only=True)
    drain = serializers.SerializerMethodField()
    reserved_for = serializers.SerializerMethodField()

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
            "token_expires_at": {
                "help_text": "When the agent's host token expires (it is renewed over the "
                "agent's connection before that); null: not enrolled, revoked, or a token from "
                "before tokens expired (renewed at the agent's next connection)."
            }
        }

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


class LabelsField(BoundedDictField):
    """A label map: at most 32 labels, Kubernetes-like keys of at most 63 characters, values
    of at most 63 printable characters (:mod:`fleet.inventory.labels`)."""

    child = serializers.CharField(max_length=MAX_VALUE_CHARS, allow_blank=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_entries=MAX_LABELS, **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        self.check_size(data)
        problems = labels_problems(data)
        if problems:
            raise serializers.ValidationError(problems[:20])
        return dict(super().to_internal_value(data))


class HostCreateSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", max_length=200)
    labels = LabelsField(required=False)


class HostUpdateSerializer(serializers.Serializer[Any]):
    labels = LabelsField(help_text="The host's labels, replacing the current ones.")


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": ID_MAX},
            {"type": "string", "minLength": 1, "maxLength": 100},
        ]
    }
)
class TeamRefField(serializers.Field):  # type: ignore[type-arg]
    """A team in a request body: its id, or its slug."""

    default_error_messages = {"invalid": "A team is an id (a whole number) or a slug."}

    def to_internal_value(self, data: Any) -> int | str:
        if isinstance(data, int) and not isinstance(data, bool) and 1 <= data <= ID_MAX:
            return data
        # No NUL: PostgreSQL cannot compare a text holding one (a 500, not a 400).
        if isinstance(data, str) and 0 < len(data.strip()) <= 100 and "\x00" not in data:
            return data.strip()
        raise serializers.ValidationError(self.error_messages["invalid"], code="invalid")

    def to_representation(self, value: Any) -> Any:
        return value


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


class GpuSerializer(serializers.ModelSerializer[Gpu]):
    host_name = serializers.CharField(source="host.name", read_only=True)
    last_telemetry = serializers.SerializerMethodField()
    last_telemetry_at = serializers.SerializerMethodField()

    def _latest(self, obj: Gpu) -> tuple[dict[str, Any], Any]:
        latest = self.context.get("latest_telemetry")
        if latest is None:
            latest = latest_telemetry_of([obj])
        return latest.get(obj.pk, ({}, None))

    @extend_schema_field(
        serializers.DictField(
            help_text="Latest sample as the agent sent it; null values mean NVML has none."
        )
    )
    def get_last_telemetry(self, obj: Gpu) -> dict[str, Any]:
        return self._latest(obj)[0]

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_last_telemetry_at(self, obj: Gpu) -> str | None:
        at = self._latest(obj)[1]
        return at.isoformat() if at is not None else None

    class Meta:
        model = Gpu
        fields = [
            "id",
            "host",
            "host_name",
            "index",
            "uuid",
            "product_name",
            "product_key",
            "pci_device_id",
            "memory_mib",
            "mig_capable",
            "mig_enabled",
            "mode",
            "health",
            "health_reason",
            "health_cause",
            "health_changed_at",
            "cordoned",
            "auto_cordoned",
            "cordon_reason",
            "observed",
            "last_telemetry",
            "last_telemetry_at",
        ]
        read_only_fields = fields


class PartitionSerializer(serializers.ModelSerializer[Partition]):
    allocated = serializers.SerializerMethodField()

    class Meta:
        model = Partition
        fields = [
            "id",
            "gpu",
            "kind",
            "profile_id",
            "profile_name",
            "start",
            "size",
            "compute_slices",
            "memory_mib",
            "mps_enabled",
            "mps_default_active_thread_percentage",
            "mps_default_pinned_mem_limit_mib",
            "mps_max_clients",
            "uuid",
            "allocated",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(help_text="Allocations bound to this partition."))
    def get_allocated(self, obj: Partition) -> int:
        return len(obj.allocations.all())


def reader_sees_spec(context: Mapping[str, Any], team_id: int | None) -> bool:
    """Whether the request in ``context`` may read the workload specs of ``team_id``'s
    deployments (:func:`fleet.core.teams.can_see_spec`). No request: the answer to a write,
    read by its author, who operates the team."""
    request = context.get("request")
    return request is None or can_see_spec(request.user, team_id)


@extend_schema_serializer(component_name="ImagePin")
class ImagePinSerializer(serializers.Serializer[Any]):
    """A container image's pin: the digest its registry served when the workload was set."""

    image = serializers.CharField(help_text="The image as given (its tag).")
    reference = serializers.CharField(
        allow_null=True,
        help_text="`name@sha256:…`, what the agents pull; `null`: they pull the tag (`reason`).",
    )
    reason = serializers.CharField(
        help_text="Why the tag was kept (no registry answered, a private address, credentials "
        "wanted, no such tag); empty when pinned."
    )
    at = serializers.DateTimeField(help_text="When the registry was asked.")


class WorkloadReadSerializer(WorkloadSerializer):
    """What each replica runs on its slice, as the API answers it: in full (``redacted:
    false``), or, for a reader outside the deployment's team without a fleet role, only its
    ``runtime`` with ``redacted: true``."""

    image_pin = ImagePinSerializer(
        read_only=True,
        allow_null=True,
        help_text="A container's image pinned to its digest at create or rolling update "
        "(`null` for other runtimes and for workloads set before pinning).",
    )
    redacted = serializers.BooleanField(
        read_only=True,
        help_text="true: another team's workload, of which only `runtime` is shown (its team's "
        "members and fleet viewers and up read it all).",
    )

    def to_representation(self, instance: Any) -> Any:
        if isinstance(instance, Mapping) and instance.get("redacted") is True:
            return dict(instance)
        return {"image_pin": None, **super().to_representation(instance), "redacted": False}


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    placed_replicas = serializers.SerializerMethodField()
    running_replicas = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()
    workload = WorkloadReadSerializer(read_only=True)
    team_slug = serializers.CharField(source="team.slug", read_only=True)
    endpoint = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "team",
            "team_slug",
            "kind",
            "profile",
            "memory_mib",
            "max_compute_percent",
            "gpu_count",
            "replicas",
            "auto_place",
            "placed_replicas",
            "running_replicas",
            "status",
            "workload",
            "host_labels",
            "host_memory_mib",
            "endpoint",
            "deleting",
            "created_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "host_memory_mib": {
                "help_text": "Host memory each replica's workload may use (its container's or "
                "process's limit); `null`: the team policy's `default_host_memory_mib`."
            },
            "host_labels": {
                "help_text": "Labels every host of its replicas carries (rule "
                "`placement.host_labels`); `{}`: any host."
            },
            "auto_place": {
                "help_text": "Created with `auto`: the engine places every replica, those added "
                "by scaling too."
            },
        }

    def to_representation(self, instance: Deployment) -> Any:
        data = super().to_representation(instance)
        if not reader_sees_spec(self.context, instance.team_id):
            data["workload"] = workload_redacted(instance.workload)
        return data

    def _placed(self, obj: Deployment) -> int:
        return len(
            {a.replica for a in obj.allocations.all() if a.state != AllocationState.RELEASING}
        )

    @extend_schema_field(EndpointReadSerializer(allow_null=True))
    def get_endpoint(self, obj: Deployment) -> dict[str, Any] | None:
        """The one address its ready replicas answer at, through the gateways; `null`: none."""
        return endpoint_read(obj)

    @extend_schema_field(serializers.IntegerField())
    def get_placed_replicas(self, obj: Deployment) -> int:
        return self._placed(obj)

    @extend_schema_field(
        serializers.IntegerField(help_text="Replicas whose workload runs and passes its check.")
    )
    def get_running_replicas(self, obj: Deployment) -> int:
        return len(
            {
                a.replica
                for a in obj.allocations.all()
                if a.state != AllocationState.RELEASING
                and a.workload_state == WorkloadState.RUNNING
            }
        )

    @extend_schema_field(serializers.ChoiceField(choices=["pending", "partial", "placed"]))
    def get_status(self, obj: Deployment) -> str:
        placed = self._placed(obj)
        if placed == 0:
            return "pending"
        return "placed" if placed >= obj.replicas else "partial"


class DeploymentCreateSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", max_length=200)
    kind = serializers.ChoiceField(choices=RequestKind.choices)
    profile = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=32,
        help_text="MIG: e.g. `1g.10gb` or `mig-1g.10gb`.",
    )
    memory_mib = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=10_000_000,
        help_text="MPS: GPU memory to reserve.",
    )
    max_compute_percent = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=100,
        help_text="MPS: optional compute cap.",
    )
    gpu_count = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=64,
        help_text="Whole GPUs per replica, on one host.",
    )
    replicas = serializers.IntegerField(default=1, min_value=1, max_value=1000)
    team = serializers.RegexField(
        r"^[A-Za-z0-9_-]{1,100}$",
        required=False,
        help_text="The owning team, by id or slug; none given: the team you operate if there is "
        "one only, or `default` for a fleet operator.",
    )
    workload = WorkloadSerializer(
        required=False, help_text="What each replica runs; none given: nothing (runtime `none`)."
    )
    auto = serializers.BooleanField(
        default=False, help_text="Let the placement engine place every replica."
    )
    host_labels = LabelsField(
        required=False,
        help_text='Labels every host of its replicas must carry, e.g. `{"zone": "a"}` '
        "(at most 32; fixed at creation).",
    )
    host_memory_mib = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=16,
        max_value=16 * 1024 * 1024,
        help_text="Host memory each replica's workload may use, at most the team policy's "
        "`max_host_memory_mib` (else 422 `policy.host_memory_denied`); none given: the "
        "policy's `default_host_memory_mib`. Fixed at creation.",
    )
    endpoint = EndpointSerializer(
        required=False,
        allow_null=True,
        help_text="The one address its ready replicas answer at, through the gateways "
        '(e.g. `{"port": "http", "path_prefix": "/qwen"}`); 409 `endpoint.taken` when another '
        "deployment has the path or host name, 422 `endpoint.port_unknown` when the workload "
        "declares no such port. Nothing is created then.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs["kind"]
        errors: dict[str, str] = {}
        if kind == RequestKind.MIG and not attrs.get("profile"):
            errors["profile"] = "Required for a MIG request."
        if kind == RequestKind.MPS and not attrs.get("memory_mib"):
            errors["memory_mib"] = "Required for an MPS request."
        if kind == RequestKind.GPU and not attrs.get("gpu_count"):
            errors["gpu_count"] = "Required for a whole-GPU request."
        for field, allowed in (
            ("profile", RequestKind.MIG),
            ("memory_mib", RequestKind.MPS),
            ("max_compute_percent", RequestKind.MPS),
            ("gpu_count", RequestKind.GPU),
        ):
            if attrs.get(field) not in (None, "") and kind != allowed:
                errors[field] = f"Only for kind '{allowed}'."
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class PlaceSerializer(serializers.Serializer[Any]):
    partition = IdField(required=False)
    gpu = IdField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("partition" in attrs) == ("gpu" in attrs):
            raise serializers.ValidationError("Give exactly one of 'partition' or 'gpu'.")
        return attrs


class RolloutSettingsSerializer(serializers.Serializer[Any]):
    max_surge = serializers.IntegerField(
        required=False, min_value=1, max_value=10, help_text="New copies on their way at once."
    )
    max_unavailable = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=10,
        help_text="Replicas that may be stopped, then placed again, when their new copy has no "
        "room beside them (0: never; the rollout fails instead).",
    )
    min_ready_s = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=3600,
        help_text="A new copy counts as updated once it has stayed running this long (no "
        "restart, no exit), as Kubernetes' minReadySeconds; default "
        "FLEET_ROLLOUT_MIN_READY_SECONDS (10).",
    )
    timeout_s = serializers.IntegerField(
        required=False,
        min_value=10,
        max_value=3600,
        help_text="How long a new copy has to run before the rollout rolls back.",
    )


class DeploymentUpdateSerializer(serializers.Serializer[Any]):
    """The body of ``PATCH /deployments/{id}/`` (for the schema; the services check it: any
    other field is refused)."""

    replicas = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        help_text="The new replica count. Up: new replicas wait to be placed (auto-placed "
        "deployments: placed by the engine at once, all or none). Down: the newest replicas "
        "(highest index) stop first.",
    )
    workload = WorkloadSerializer(
        required=False,
        help_text="A new workload: a rolling update, one replica (max_surge) at a time, each new "
        "copy running before its old one stops; a failure rolls back.",
    )
    rollout = RolloutSettingsSerializer(required=False)
    endpoint = EndpointSerializer(
        required=False,
        allow_null=True,
        help_text="Its endpoint, set or changed (`null` removes it); 409 `endpoint.taken` when "
        "another deployment has the path or host name.",
    )
    team = serializers.CharField(
        required=False,
        max_length=64,
        help_text="Hand the deployment to this team (id or slug): you must operate both teams, "
        "and the new team's quota must hold its replicas in place (else 422 "
        "`quota.exceeded`). Its replicas stay where they are; usage is billed to the new team "
        "from now on.",
    )


class EvictSerializer(serializers.Serializer[Any]):
    replica = serializers.IntegerField(required=False, min_value=0, max_value=999)


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
            "created_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "replaces": {
                "help_text": "A move's new copy: the allocation it replaces once it runs (null "
                "otherwise)."
            }
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


class HealthEventSerializer(serializers.ModelSerializer[HealthEvent]):
    class Meta:
        model = HealthEvent
        fields = ["id", "host", "gpu", "kind", "xid", "gpu_instance_id", "detail", "ts"]
        read_only_fields = fields


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


class MeSerializer(serializers.Serializer[Any]):
    username = serializers.CharField()
    role = serializers.CharField()


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


class DrainSerializer(serializers.Serializer[Any]):
    layout = LayoutSerializer(
        required=False, allow_null=True, help_text="Reshape to this layout once drained."
    )
    timeout_s = serializers.IntegerField(default=300, min_value=5, max_value=86_400)


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    prefix = serializers.CharField(
        read_only=True,
        help_text="The token's public part (`fla_<prefix>_…`); empty on some older tokens: "
        "tell those apart by id and created_at.",
    )
    expires_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Refused from this time on; null: never."
    )

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "last_used_at"]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_TOKEN_DAYS,
        help_text="The token stops working after this many days; omit or null: never.",
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its hash is kept.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


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
