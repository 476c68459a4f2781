"""Output serializers (rows to JSON) and input serializers (JSON to service arguments)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.allocations.selectors import allocation_environment
from fleet.core.models import ApiToken
from fleet.inventory.models import Gpu, Host, SharingMode
from fleet.inventory.selectors import latest_telemetry_of
from fleet.partitioning.models import Operation, Partition


class ErrorSerializer(serializers.Serializer[Any]):
    code = serializers.CharField(help_text="Stable machine-readable code, e.g. `mig.overlap`.")
    message = serializers.CharField()
    details = serializers.DictField(
        help_text="Facts about the error; `violations` lists broken rules."
    )


class HostSerializer(serializers.ModelSerializer[Host]):
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Host
        fields = [
            "id",
            "name",
            "hostname",
            "status",
            "labels",
            "agent_version",
            "driver_version",
            "nvml_version",
            "last_seen_at",
            "desired_generation",
            "applied_generation",
            "dispatched_generation",
            "gpu_count",
            "created_at",
        ]
        read_only_fields = fields


class HostCreateSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$", max_length=200)
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False)


class HostCreatedSerializer(HostSerializer):
    enrollment_token = serializers.CharField(
        read_only=True, help_text="Shown once. Give it to the agent."
    )

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "enrollment_token"]
        read_only_fields = fields


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


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    placed_replicas = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "kind",
            "profile",
            "memory_mib",
            "max_compute_percent",
            "gpu_count",
            "replicas",
            "placed_replicas",
            "status",
            "created_at",
        ]
        read_only_fields = fields

    def _placed(self, obj: Deployment) -> int:
        return len({a.replica for a in obj.allocations.all()})

    @extend_schema_field(serializers.IntegerField())
    def get_placed_replicas(self, obj: Deployment) -> int:
        return self._placed(obj)

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
    auto = serializers.BooleanField(
        default=False, help_text="Let the placement engine place every replica."
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
    partition = serializers.IntegerField(required=False, min_value=1)
    gpu = serializers.IntegerField(required=False, min_value=1)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("partition" in attrs) == ("gpu" in attrs):
            raise serializers.ValidationError("Give exactly one of 'partition' or 'gpu'.")
        return attrs


class EvictSerializer(serializers.Serializer[Any]):
    replica = serializers.IntegerField(required=False, min_value=0, max_value=999)


class AllocationSerializer(serializers.ModelSerializer[Allocation]):
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    environment = serializers.SerializerMethodField()

    @extend_schema_field(
        serializers.DictField(
            child=serializers.CharField(),
            help_text="CUDA_VISIBLE_DEVICES and, for MPS shares, the CUDA_MPS_* limits and pipe.",
        )
    )
    def get_environment(self, obj: Allocation) -> dict[str, str]:
        return allocation_environment(obj)

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
            "created_at",
        ]
        read_only_fields = fields


class OperationSerializer(serializers.ModelSerializer[Operation]):
    requested_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

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


class MpsPolicySerializer(serializers.Serializer[Any]):
    default_active_thread_percentage = serializers.IntegerField(
        default=100, min_value=1, max_value=100
    )
    default_pinned_mem_limit_mib = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=10_000_000
    )
    max_clients = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=48
    )


class MigInstanceInputSerializer(serializers.Serializer[Any]):
    profile = serializers.CharField(
        max_length=32, help_text="Profile name (`3g.40gb`) or NVML profile id (`9`)."
    )
    start = serializers.IntegerField(
        min_value=0, max_value=63, help_text="First memory slice of the placement."
    )
    mps = MpsPolicySerializer(
        required=False, allow_null=True, help_text="Run an MPS daemon inside this instance."
    )


class LayoutSerializer(serializers.Serializer[Any]):
    mode = serializers.ChoiceField(choices=SharingMode.choices)
    instances = serializers.ListField(
        child=MigInstanceInputSerializer(), required=False, max_length=16
    )
    mps = MpsPolicySerializer(required=False, allow_null=True)


class MigValidateSerializer(serializers.Serializer[Any]):
    product = serializers.CharField(
        required=False, max_length=128, help_text="NVML product name, catalog key or PCI device id."
    )
    gpu = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="Validate for this GPU (uses its reported placements).",
    )
    instances = serializers.ListField(child=MigInstanceInputSerializer(), max_length=16)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("product" in attrs) == ("gpu" in attrs):
            raise serializers.ValidationError("Give exactly one of 'product' or 'gpu'.")
        return attrs


class ViolationSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


class PlacementOutSerializer(serializers.Serializer[Any]):
    profile = serializers.CharField()
    profile_id = serializers.IntegerField()
    start = serializers.IntegerField()
    size = serializers.IntegerField()


class MigValidateResultSerializer(serializers.Serializer[Any]):
    valid = serializers.BooleanField()
    product = serializers.CharField()
    placements = PlacementOutSerializer(many=True)
    violations = ViolationSerializer(many=True)


class CatalogProfileSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    compute_slices = serializers.IntegerField()
    memory_slices = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    max_instances = serializers.IntegerField()
    media = serializers.CharField()
    placements = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField())
    )


class CatalogProductSerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    name = serializers.CharField()
    aliases = serializers.ListField(child=serializers.CharField())
    pci_device_ids = serializers.ListField(child=serializers.CharField())
    memory_mib = serializers.IntegerField()
    mig_capable = serializers.BooleanField()
    memory_slice_count = serializers.IntegerField()
    compute_slice_count = serializers.IntegerField()
    max_instances = serializers.IntegerField()
    profiles = CatalogProfileSerializer(many=True)


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
    feasible = FeasibleTargetSerializer(many=True)
    infeasible = InfeasibleTargetSerializer(many=True)


class DrainSerializer(serializers.Serializer[Any]):
    layout = LayoutSerializer(
        required=False, allow_null=True, help_text="Reshape to this layout once drained."
    )
    timeout_s = serializers.IntegerField(default=300, min_value=5, max_value=86_400)


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at"]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100)


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
