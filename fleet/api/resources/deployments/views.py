"""``/deployments/``: create, read, change (scale, rolling update, hand-over, endpoint) and
delete deployments; the placement commands are :mod:`fleet.api.resources.placement.views`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.allocations import services as allocation_services
from fleet.allocations.autoplace import deployment_create_placed
from fleet.allocations.details import deployment_set_details
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.scaling import deployment_update
from fleet.api.common import ReadViewSet, documented_reads, error_responses, parse_id, validated
from fleet.api.filters import DeploymentFilter
from fleet.api.permissions import authorize_deployment, team_for_create
from fleet.api.resources.deployments.serializers import (
    DeploymentCreateSerializer,
    DeploymentDetailsSerializer,
    DeploymentSerializer,
    DeploymentUpdateSerializer,
)
from fleet.api.resources.endpoints.serializers import (
    TrafficQuerySerializer,
    TrafficSerializer,
    traffic_read,
)
from fleet.api.resources.operations.serializers import OperationSerializer
from fleet.api.resources.placement.views import DeploymentPlacementActions
from fleet.autoscaling.policy import autoscaling_set
from fleet.core.errors import NotFound, ServiceError
from fleet.core.models import OperationKind
from fleet.core.permissions import TeamRolePermission
from fleet.endpoints.history import WINDOWS_S, deployment_history
from fleet.endpoints.services import endpoint_set
from fleet.endpoints.traffic import deployment_traffic


@documented_reads(DeploymentSerializer)
class DeploymentViewSet(
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    DeploymentPlacementActions,
    ReadViewSet[Deployment],
):
    """Workloads. Commands: place (a drop in the UI), place-all (every replica that fits now)
    and evict; `auto` lets the engine place; PATCH scales or rolls out a new workload.

    Every role reads every team's deployments; what one runs (`workload`: image, command, env,
    ...) only its team's members and fleet viewers and up (others get its `runtime` only, with
    `redacted: true`). Fleet operators act on all of them, a team operator on its team's only
    (403 `auth.forbidden` on another team's)."""

    serializer_class = DeploymentSerializer
    filterset_class = DeploymentFilter
    ordering_fields = ["name", "created_at", "kind"]
    permission_classes = [TeamRolePermission]
    # Defragmenting moves other deployments' replicas, maybe other teams': fleet operators only.
    team_actions = frozenset({"create", "partial_update", "destroy", "place", "place_all", "evict"})

    def get_queryset(self) -> QuerySet[Deployment]:
        return (
            Deployment.objects.select_related("team", "endpoint", "autoscaling")
            .prefetch_related(
                Prefetch(
                    "allocations",
                    queryset=Allocation.objects.only(
                        "id", "replica", "deployment_id", "state", "workload_state"
                    ),
                )
            )
            .order_by("name")
        )

    @extend_schema(
        request=DeploymentCreateSerializer,
        responses={201: DeploymentSerializer, **error_responses(400, 401, 403, 409, 422)},
        description=(
            "The workload must be allowed by the team's policy (`GET /teams/{id}/policy`), "
            "else 422 naming the rule: `policy.runtime_denied` (a `process` workload, unless a "
            "fleet admin allowed it), `policy.image_denied`, `policy.user_denied` (root, or a "
            "uid outside the allowed ranges), `policy.host_memory_denied`. Nothing is created."
        ),
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(DeploymentCreateSerializer, request)
        team_id = team_for_create(request.user, data.get("team"))
        create: Callable[..., Deployment] = allocation_services.deployment_create
        if data["auto"] or data["wait"]:
            create = functools.partial(deployment_create_placed, wait=data["wait"])
        with transaction.atomic():  # an endpoint refused: no deployment either
            deployment = self._create(create, data, team_id, request)
            details = {k: data[k] for k in Deployment.DETAIL_FIELDS if k in data}
            if details:
                deployment_set_details(deployment_id=deployment.pk, details=details)
            if data.get("endpoint") is not None:
                endpoint_set(
                    deployment_id=deployment.pk,
                    spec=dict(request.data["endpoint"]),
                    requested_by=request.user,
                )
            if data.get("autoscaling") is not None:
                autoscaling_set(
                    deployment_id=deployment.pk,
                    spec=dict(request.data["autoscaling"]),
                    requested_by=request.user,
                )
        return Response(
            DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data,
            status=status.HTTP_201_CREATED,
        )

    def _create(self, create: Any, data: dict[str, Any], team_id: int, request: Request) -> Any:
        return create(
            name=data["name"],
            request=allocation_services.DeploymentRequest(
                kind=data["kind"],
                profile=data.get("profile") or "",
                memory_mib=data.get("memory_mib"),
                max_compute_percent=data.get("max_compute_percent"),
                gpu_count=data.get("gpu_count"),
            ),
            replicas=data["replicas"],
            workload=data.get("workload"),
            host_labels=data.get("host_labels"),
            team_id=team_id,
            host_memory_mib=data.get("host_memory_mib"),
            requested_by=request.user,
        )

    @extend_schema(
        request=DeploymentUpdateSerializer,
        responses={
            200: DeploymentSerializer,
            202: OperationSerializer,
            **error_responses(400, 401, 403, 404, 409, 422),
        },
        description=(
            'Scale: `{"replicas": n}` (1..1000), the only field that can change. New replicas '
            "wait to be placed, or are placed by the engine at once (all or none, else 422) when "
            "the deployment is `auto_place`; scaling down stops the newest replicas (highest "
            "index) first, through eviction (a running workload's slice stays `releasing` until "
            "it has stopped). Answers 200 with the deployment. "
            '`{"workload": {...}, "rollout": {"max_surge": 1, "max_unavailable": 0}}`: a rolling '
            "update, answered 202 with the `rollout` operation (follow it): each replica gets a "
            "new copy with the new workload, which runs before the old copy stops; a new copy "
            "that fails stops the rollout and rolls the updated replicas back. One change at a "
            "time (`deployment.one_change`); a rollout in progress is a 409. Any other field is "
            "a 400 (`deployment.field_immutable`, `deployment.field_unknown`); a deployment "
            'being deleted is a 409. `{"team": "search"}` hands the deployment to another team '
            "(id or slug; you must operate both, and its quota must hold the replicas in place, "
            "else 422 `quota.exceeded`): its replicas stay put, usage is billed to the new team "
            "from then on; answered 200 with the deployment. A new workload, and a deployment "
            "handed to another team, must be allowed by the (new) team's policy, else 422 "
            "`policy.*` as on create. The deployment's details (the other fields of the body) "
            "change in place, alone or with any one of these, all or nothing; answered 200 with "
            "the deployment unless a rollout started."
        ),
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not isinstance(request.data, Mapping):
            raise ServiceError("malformed_request", "The body must be a JSON object.")
        deployment_id = parse_id(kwargs.get("pk"))
        authorize_deployment(request.user, deployment_id)
        changes = dict(request.data)
        details = _details(changes)
        if "team" in changes:  # the team it goes to: the user must operate that one too
            named = changes["team"]
            if not isinstance(named, str | int) or isinstance(named, bool):
                raise ServiceError("team.not_found", "'team' is a team's id or slug.")
            changes["team"] = team_for_create(request.user, str(named)[:64])
        with transaction.atomic():  # the details, the endpoint and the rest, or none
            if details:
                deployment_set_details(deployment_id=deployment_id, details=details)
            if "endpoint" in changes:
                endpoint_set(
                    deployment_id=deployment_id,
                    spec=changes.pop("endpoint"),
                    requested_by=request.user,
                )
            if "autoscaling" in changes:
                autoscaling_set(
                    deployment_id=deployment_id,
                    spec=changes.pop("autoscaling"),
                    requested_by=request.user,
                )
            operation = (
                deployment_update(
                    deployment_id=deployment_id, changes=changes, requested_by=request.user
                )
                if changes or not (details or {"endpoint", "autoscaling"} & set(request.data))
                else None
            )
        if operation is not None and operation.kind == OperationKind.DEPLOYMENT_ROLLOUT:
            return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)
        return Response(DeploymentSerializer(self.get_queryset().get(pk=deployment_id)).data)

    @extend_schema(
        parameters=[TrafficQuerySerializer],
        responses={200: TrafficSerializer, **error_responses(400, 401, 403, 404)},
        description=(
            "Its endpoint's traffic as the gateways measured it over their last 5 s, in total "
            "and per replica (several gateways add up); with `?window=5m|15m|1h`, its history "
            "too (`history`). 404 `traffic.not_available` when no gateway has measured it in "
            "the last 10 s (no endpoint, or no `fleet_gateway` running)."
        ),
    )
    @action(detail=True, methods=["get"])
    def traffic(self, request: Request, pk: str | None = None) -> Response:
        query = TrafficQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        deployment = self.get_object()
        found = deployment_traffic(deployment.pk)
        if found is None:
            raise NotFound(
                "traffic.not_available",
                f"No gateway has measured {deployment.name}'s endpoint in the last 10 s.",
                {"deployment": deployment.pk},
            )
        window = query.validated_data.get("window")
        history = (
            None
            if window is None
            else deployment_history(deployment.pk, window_s=WINDOWS_S[window])
        )
        return Response(TrafficSerializer(traffic_read(found, history)).data)

    @extend_schema(responses={204: None, **error_responses(401, 403, 404)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        authorize_deployment(request.user, parse_id(kwargs.get("pk")))
        allocation_services.deployment_delete(
            deployment_id=parse_id(kwargs.get("pk")), requested_by=request.user
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


def _details(changes: dict[str, Any]) -> dict[str, Any]:
    """Take the deployment's details out of a PATCH body, checked (400 ``invalid``)."""
    given = {k: changes.pop(k) for k in Deployment.DETAIL_FIELDS if k in changes}
    if not given:
        return {}
    body = DeploymentDetailsSerializer(data=given, partial=True)
    body.is_valid(raise_exception=True)
    return dict(body.validated_data)
