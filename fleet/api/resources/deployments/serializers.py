"""Deployments: the deployment as the API reads it, and the bodies that create and change it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.allocations.models import (
    AllocationState,
    Deployment,
    RequestKind,
    WorkloadState,
)
from fleet.allocations.states import STATUS_HELP, DeploymentStatus, deployment_statuses
from fleet.api.fields import LabelsField
from fleet.api.permissions import reader_sees_spec
from fleet.api.resources.autoscaling.serializers import (
    AutoscalingReadSerializer,
    AutoscalingSerializer,
    autoscaling_read,
)
from fleet.api.resources.endpoints.serializers import (
    EndpointReadSerializer,
    EndpointSerializer,
    endpoint_read,
)
from fleet.api.resources.workloads.serializers import WorkloadReadSerializer, WorkloadSerializer
from fleet.core.redaction import workload_redacted


class DeploymentDetailsSerializer(serializers.ModelSerializer[Deployment]):
    """A deployment's details (``Deployment.DETAIL_FIELDS``), as the create and update bodies
    take them: each with its model field's bounds and help text."""

    class Meta:
        model = Deployment
        fields = Deployment.DETAIL_FIELDS


def with_details(fields: dict[str, Any]) -> dict[str, Any]:
    """A body's fields plus the deployment's details (each optional)."""
    details = DeploymentDetailsSerializer().get_fields()
    for field in details.values():
        field.required = False
    return {**fields, **details}


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    placed_replicas = serializers.SerializerMethodField()
    running_replicas = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()
    workload = WorkloadReadSerializer(read_only=True)
    team_slug = serializers.CharField(source="team.slug", read_only=True)
    endpoint = serializers.SerializerMethodField()
    autoscaling = serializers.SerializerMethodField()

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
            "autoscaling",
            "deleting",
            "created_at",
            *Deployment.DETAIL_FIELDS,
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

    @extend_schema_field(AutoscalingReadSerializer(allow_null=True))
    def get_autoscaling(self, obj: Deployment) -> dict[str, Any] | None:
        """Its autoscaling policy and what the last evaluation found; `null`: none."""
        return autoscaling_read(obj)

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

    @extend_schema_field(
        serializers.ChoiceField(choices=DeploymentStatus.choices, help_text=STATUS_HELP)
    )
    def get_status(self, obj: Deployment) -> str:
        # A list asks the engine once for the page's deployments, not once per row.
        known: dict[int, str] = self.context.setdefault("deployment_statuses", {})
        if obj.pk not in known:
            parent = self.parent
            batch = parent.instance if isinstance(parent, serializers.ListSerializer) else None
            known.update(deployment_statuses(list(batch) if batch is not None else [obj]))
        return str(known.get(obj.pk) or deployment_statuses([obj])[obj.pk])


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
        default=False,
        help_text="Let the placement engine place every replica: all or nothing (a replica "
        "that fits nowhere refuses the creation, 422), unless `wait`.",
    )
    wait = serializers.BooleanField(
        default=False,
        help_text="With `auto` (implied): the replicas that fit now are placed and the others "
        "wait in the queue instead of refusing the creation; the queue places them as capacity "
        "frees, and a team within its deserved share takes it back from borrowers (reclaim). "
        "`GET /allocations/{id}/what-would-it-take` says what would place one sooner.",
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
    autoscaling = AutoscalingSerializer(
        required=False,
        allow_null=True,
        help_text='Target tracking, e.g. `{"min": 1, "max": 8, "target": '
        '{"requests_per_replica_per_s": 4}}` (docs/autoscaling.md); the balancer\'s metrics '
        "need an endpoint (else 422 `autoscaling.needs_endpoint`); `null` turns it off.",
    )

    def get_fields(self) -> dict[str, Any]:
        return with_details(super().get_fields())

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
    autoscaling = AutoscalingSerializer(
        required=False,
        allow_null=True,
        help_text='Target tracking, e.g. `{"min": 1, "max": 8, "target": '
        '{"requests_per_replica_per_s": 4}}` (docs/autoscaling.md); the balancer\'s metrics '
        "need an endpoint (else 422 `autoscaling.needs_endpoint`); `null` turns it off.",
    )
    team = serializers.CharField(
        required=False,
        max_length=64,
        help_text="Hand the deployment to this team (id or slug): you must operate both teams, "
        "and the new team's quota must hold its replicas in place (else 422 "
        "`quota.exceeded`). Its replicas stay where they are; usage is billed to the new team "
        "from now on.",
    )

    def get_fields(self) -> dict[str, Any]:
        return with_details(super().get_fields())
