"""Serializers of ``/capacity/``: its query (one request shape, optional) and its answer, the
repack plan and the layout advice."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.allocations.models import RequestKind
from fleet.mig import PRODUCTS
from fleet.mps import MAX_COMPUTE_PERCENT, MpsRequest
from fleet.placement import MigRequest, PlacementRequest, WholeGpuRequest

_ONLY_FOR = (
    ("profile", RequestKind.MIG),
    ("memory_mib", RequestKind.MPS),
    ("max_compute_percent", RequestKind.MPS),
    ("gpu_count", RequestKind.GPU),
)
_REQUIRED = {
    RequestKind.MIG: ("profile", "a MIG request"),
    RequestKind.MPS: ("memory_mib", "an MPS request"),
    RequestKind.GPU: ("gpu_count", "a whole-GPU request"),
}


class CapacityQuerySerializer(serializers.Serializer[Any]):
    """The query of ``GET /capacity/``: a request shape, as a deployment declares it."""

    kind = serializers.ChoiceField(
        choices=RequestKind.choices,
        required=False,
        help_text="Ask how many replicas of one request fit: `mig` (with `profile`), `mps` "
        "(with `memory_mib`, optional `max_compute_percent`) or `gpu` (with `gpu_count`).",
    )
    profile = serializers.CharField(
        required=False, max_length=32, help_text="MIG: e.g. `1g.10gb` or `mig-1g.10gb`."
    )
    memory_mib = serializers.IntegerField(
        required=False, min_value=1, max_value=10_000_000, help_text="MPS: memory to reserve."
    )
    max_compute_percent = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_COMPUTE_PERCENT,
        help_text="MPS: optional compute cap.",
    )
    gpu_count = serializers.IntegerField(
        required=False, min_value=1, max_value=64, help_text="Whole GPUs per replica, one host."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                dict.fromkeys(unknown, f"Unknown parameter; use {', '.join(self.fields)}.")
            )
        kind = attrs.get("kind")
        errors: dict[str, str] = {}
        if kind is None:
            errors.update({f: "Give 'kind' with it." for f, _ in _ONLY_FOR if f in attrs})
        else:
            field, what = _REQUIRED[kind]
            if field not in attrs:
                errors[field] = f"Required for {what}."
            errors.update(
                {f: f"Only for kind '{k}'." for f, k in _ONLY_FOR if f in attrs and k != kind}
            )
        profile = attrs.get("profile")
        if profile is not None and not any(p.profile(profile) for p in PRODUCTS):
            errors["profile"] = f"No GPU product has a MIG profile {profile!r}."
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def placement_request(data: dict[str, Any]) -> PlacementRequest | None:
    """The request a valid query asks about, if any."""
    kind = data.get("kind")
    if kind == RequestKind.MIG:
        return MigRequest(data["profile"])
    if kind == RequestKind.MPS:
        return MpsRequest(data["memory_mib"], data.get("max_compute_percent"))
    if kind == RequestKind.GPU:
        return WholeGpuRequest(data["gpu_count"])
    return None


class CapacityProfileSerializer(serializers.Serializer[Any]):
    profile = serializers.CharField()
    profile_id = serializers.IntegerField()
    fits_now = serializers.IntegerField(
        help_text="Idle instances of the profile, plus the most new ones that fit beside every "
        "instance (all MIG rules count), summed over the schedulable MIG GPUs."
    )
    fits_if_idle_reshaped = serializers.IntegerField(
        help_text="The same when every idle instance may be destroyed first."
    )


class CapacityMigSerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField(help_text="Schedulable GPUs in MIG mode.")
    profiles = CapacityProfileSerializer(many=True)


class CapacityMpsSerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField(help_text="Schedulable GPUs in MPS mode.")
    free_memory_mib = serializers.IntegerField(
        help_text="Memory not reserved by clients, on every MPS daemon of the schedulable GPUs "
        "(whole-GPU daemons and daemons inside MIG instances)."
    )
    stranded_memory_mib = serializers.IntegerField(
        help_text="Free memory of daemons with clients that no MPS request of the fleet's mix "
        "can use (client or compute cap reached, or the piece too small)."
    )
    free_clients = serializers.IntegerField(help_text="Client slots left under the MPS limits.")


class CapacityWholeSerializer(serializers.Serializer[Any]):
    free_gpus = serializers.IntegerField(help_text="Free schedulable GPUs in dedicated mode.")


class CapacityProductSerializer(serializers.Serializer[Any]):
    product = serializers.CharField()
    product_key = serializers.CharField(help_text="The MIG catalog key; empty when unknown.")
    gpus = serializers.IntegerField()
    schedulable_gpus = serializers.IntegerField(help_text="Healthy, not cordoned, on a ready host.")
    mig = CapacityMigSerializer()
    mps = CapacityMpsSerializer()
    whole = CapacityWholeSerializer()


class CapacityHostSerializer(serializers.Serializer[Any]):
    host_id = serializers.IntegerField()
    host = serializers.CharField()
    score = serializers.FloatField(help_text="Fragmented share of the host's free GPU, 0-1.")
    free_gpu_equivalents = serializers.FloatField()
    stranded_gpu_equivalents = serializers.FloatField()


class CapacityFragmentationSerializer(serializers.Serializer[Any]):
    score = serializers.FloatField(
        help_text="FGD's fragmentation of the schedulable hosts against the fleet's request "
        "mix, as a share of their free GPU (0-1)."
    )
    stranded_gpu_equivalents = serializers.FloatField(help_text="The fragmented GPU, in GPUs.")
    free_gpu_equivalents = serializers.FloatField(help_text="The free GPU, in GPUs.")
    hosts = CapacityHostSerializer(many=True)


class CapacityRequestProductSerializer(serializers.Serializer[Any]):
    product = serializers.CharField()
    product_key = serializers.CharField()
    fits_now = serializers.IntegerField()
    fits_if_idle_reshaped = serializers.IntegerField(allow_null=True)


class CapacityRequestSerializer(serializers.Serializer[Any]):
    kind = serializers.CharField()
    profile = serializers.CharField(allow_null=True)
    memory_mib = serializers.IntegerField(allow_null=True)
    max_compute_percent = serializers.IntegerField(allow_null=True)
    gpu_count = serializers.IntegerField(allow_null=True)
    fits_now = serializers.IntegerField(
        help_text="Replicas the engine can place now, one after another."
    )
    fits_if_idle_reshaped = serializers.IntegerField(
        allow_null=True, help_text="MIG: replicas after idle instances are reshaped; else null."
    )
    products = CapacityRequestProductSerializer(
        many=True, help_text="MIG and MPS: per product (whole-GPU requests: empty)."
    )


class CapacitySerializer(serializers.Serializer[Any]):
    products = CapacityProductSerializer(many=True)
    fragmentation = CapacityFragmentationSerializer()
    request = CapacityRequestSerializer(
        required=False, help_text="Only when the query names a request."
    )


class RepackQuerySerializer(serializers.Serializer[Any]):
    """The query of ``GET /capacity/repack`` (and the body of its ``POST``)."""

    product = serializers.CharField(
        max_length=64,
        help_text="A GPU product of the fleet: its catalog key (`h100-sxm5-80gb`) or its name.",
    )
    free_gpus = serializers.IntegerField(
        min_value=1, max_value=1024, help_text="How many GPUs of the product to empty."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                dict.fromkeys(unknown, f"Unknown parameter; use {', '.join(self.fields)}.")
            )
        return attrs


class RepackApplySerializer(RepackQuerySerializer):
    max_unavailable = serializers.IntegerField(
        min_value=1,
        max_value=64,
        default=1,
        help_text="GPUs being emptied at once (each one's moves run one after another).",
    )


class RepackGpuSerializer(serializers.Serializer[Any]):
    gpu = serializers.IntegerField()
    host = serializers.CharField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()


class RepackUnmovableSerializer(RepackGpuSerializer):
    reason = serializers.CharField()


class RepackMoveSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=["mig", "mps", "gpu"])
    allocation = serializers.IntegerField(
        allow_null=True, help_text="The replica that moves (null: an idle MIG slice destroyed)."
    )
    deployment = serializers.CharField(allow_null=True)
    replica = serializers.IntegerField(allow_null=True)
    from_gpu = serializers.IntegerField()
    from_label = serializers.CharField(help_text="`host/gpuN`.")
    to_gpu = serializers.IntegerField(allow_null=True, help_text="null: the slice is destroyed.")
    to_label = serializers.CharField(allow_null=True)
    to_partition = serializers.IntegerField(allow_null=True)
    new_instance = serializers.DictField(allow_null=True, help_text="MIG: {profile_id, start}.")


class RepackPlanSerializer(serializers.Serializer[Any]):
    product = serializers.CharField()
    product_key = serializers.CharField()
    free_gpus = serializers.IntegerField(help_text="As asked.")
    feasible = serializers.BooleanField(
        help_text="False when that many GPUs cannot be emptied (`reason` says why; no moves)."
    )
    reason = serializers.CharField(
        help_text="Why it is infeasible, or why the greedy plan answers; empty otherwise."
    )
    method = serializers.ChoiceField(choices=["cp-sat", "greedy"])
    status = serializers.CharField(
        help_text="CP-SAT's status (`optimal`, `feasible`, `infeasible`, `unknown`) or why it "
        "did not run (`not_installed`, `too_big`, `no_candidates`)."
    )
    cost = serializers.IntegerField(help_text="Replicas moved.")
    bound = serializers.IntegerField(
        help_text="A proven lower bound on the replicas any such plan moves."
    )
    time_limit_s = serializers.FloatField()
    already_free = serializers.IntegerField(help_text="GPUs of the product holding nothing now.")
    freed = RepackGpuSerializer(many=True)
    unmovable = RepackUnmovableSerializer(many=True)
    moves = RepackMoveSerializer(many=True)


class AdviceQuerySerializer(serializers.Serializer[Any]):
    """The query of ``GET /capacity/advice``."""

    product = serializers.CharField(
        max_length=128, help_text="The GPU product: NVML name or catalog key (`h100-sxm5-80gb`)."
    )
    time_limit_s = serializers.FloatField(
        required=False,
        min_value=0.1,
        max_value=10.0,
        help_text="The solver's time limit in seconds (default 5).",
    )


class AdviceSolverSerializer(serializers.Serializer[Any]):
    status = serializers.ChoiceField(
        choices=["optimal", "feasible", "heuristic", "trivial", "sequential"],
        help_text="`sequential`: the waiting deployments may use different GPUs (host labels, "
        "runtimes); each group was solved in turn, the most constrained first, and `bound` is "
        "the sum of the steps' bounds.",
    )
    objective = serializers.IntegerField()
    bound = serializers.IntegerField()
    gap_percent = serializers.FloatField()
    time_s = serializers.FloatField()
    weights = serializers.DictField(child=serializers.IntegerField())


class AdviceWaitingSerializer(serializers.Serializer[Any]):
    deployment_id = serializers.IntegerField()
    deployment = serializers.CharField()
    request = serializers.CharField()
    waiting = serializers.IntegerField()
    placed = serializers.IntegerField()


class AdvicePlaceSerializer(serializers.Serializer[Any]):
    profile = serializers.CharField()
    start = serializers.IntegerField()
    serves = serializers.CharField(help_text="The deployment it takes, or `moved`.")
    replicas = serializers.IntegerField()
    mps = serializers.BooleanField()


class AdviceInstanceSerializer(serializers.Serializer[Any]):
    profile = serializers.CharField()
    start = serializers.IntegerField()
    mps = serializers.BooleanField()


class AdviceGpuSerializer(serializers.Serializer[Any]):
    gpu = serializers.IntegerField()
    name = serializers.CharField()
    drained = serializers.BooleanField(help_text="Its running replicas move first (a drain).")
    moved_replicas = serializers.IntegerField()
    layout = serializers.DictField(help_text="The layout, as `POST /rollouts/` takes it.")
    instances = AdviceInstanceSerializer(many=True, help_text="The layout, by profile name.")
    places = AdvicePlaceSerializer(many=True)


class AdviceSerializer(serializers.Serializer[Any]):
    product = serializers.CharField()
    product_key = serializers.CharField()
    schedulable_gpus = serializers.IntegerField()
    waiting_replicas = serializers.IntegerField()
    placed_replicas = serializers.IntegerField()
    moved_replicas = serializers.IntegerField()
    waiting = AdviceWaitingSerializer(many=True)
    gpus = AdviceGpuSerializer(many=True, help_text="The GPUs whose layout changes.")
    solver = AdviceSolverSerializer()
    rollout = serializers.DictField(
        allow_null=True,
        help_text="The exact body for `POST /rollouts/`; `null` when no layout changes.",
    )
