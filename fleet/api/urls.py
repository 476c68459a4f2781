from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import DynamicRoute, SimpleRouter

from fleet.api.resources.agent import views as agent
from fleet.api.resources.alerts import views as alerts
from fleet.api.resources.allocations import views as allocations
from fleet.api.resources.capacity import views as capacity
from fleet.api.resources.deployments import views as deployments
from fleet.api.resources.events import views as events
from fleet.api.resources.gpus import views as gpus
from fleet.api.resources.hosts import views as hosts
from fleet.api.resources.me import views as me
from fleet.api.resources.mig import views as mig
from fleet.api.resources.operations import views as operations
from fleet.api.resources.partitions import views as partitions
from fleet.api.resources.policies import views as policies
from fleet.api.resources.priorities import views as priorities
from fleet.api.resources.prometheus import views as prometheus
from fleet.api.resources.queue import views as queue
from fleet.api.resources.rollouts import views as rollouts
from fleet.api.resources.secrets import views as secrets
from fleet.api.resources.teams import views as teams
from fleet.api.resources.tokens import views as tokens
from fleet.api.resources.usage import views as usage
from fleet.api.resources.wit import views as wit


class CommandRouter(SimpleRouter):
    """Collections and items end in a slash (``/deployments/``, ``/gpus/7/``); commands do not
    (``PUT /gpus/7/layout``, ``POST /deployments/3/place``)."""

    routes = [
        route._replace(url=route.url.replace("{trailing_slash}", ""))
        if isinstance(route, DynamicRoute)
        else route
        for route in SimpleRouter.routes
    ]


router = CommandRouter(trailing_slash=True)
router.register("hosts", hosts.HostViewSet, basename="host")
router.register("gpus", gpus.GpuViewSet, basename="gpu")
router.register("partitions", partitions.PartitionViewSet, basename="partition")
router.register("deployments", deployments.DeploymentViewSet, basename="deployment")
router.register("allocations", allocations.AllocationViewSet, basename="allocation")
router.register("operations", operations.OperationViewSet, basename="operation")
router.register("events", events.HealthEventViewSet, basename="event")
router.register("tokens", tokens.ApiTokenViewSet, basename="token")
router.register("alerts/webhooks", alerts.WebhookViewSet, basename="webhook")
router.register("alerts/deliveries", alerts.DeliveryViewSet, basename="delivery")
router.register("teams", teams.TeamViewSet, basename="team")

urlpatterns = [
    path("me", me.me, name="me"),
    path("usage", usage.UsageView.as_view(), name="usage"),
    path("priorities/", priorities.priorities, name="priorities"),
    path("priorities/<slug:name>/", priorities.priority, name="priority"),
    path("queue/", queue.queue, name="queue"),
    path("queue/reclaim/<int:deployment_id>", queue.reclaim, name="queue-reclaim"),
    path("prometheus/targets", prometheus.targets, name="prometheus-targets"),
    path("capacity/", capacity.capacity, name="capacity"),
    path("capacity/repack", capacity.capacity_repack, name="capacity-repack"),
    path("capacity/advice", capacity.capacity_advice, name="capacity-advice"),
    path("rollouts/", rollouts.rollouts, name="rollouts"),
    path("rollouts/<int:pk>/", rollouts.rollout, name="rollout"),
    path("rollouts/<int:pk>/resume", rollouts.rollout_resume, name="rollout-resume"),
    path("rollouts/<int:pk>/abort", rollouts.rollout_abort, name="rollout-abort"),
    path("mig/catalog/", mig.catalog, name="mig-catalog"),
    path("mig/validate", mig.validate, name="mig-validate"),
    path("mig/migparted", mig.migparted_import, name="mig-migparted"),
    path("gpus/<int:pk>/migparted", mig.migparted_export, name="gpu-migparted"),
    path("allocations/<int:pk>/logs", allocations.allocation_logs, name="allocation-logs"),
    path(
        "allocations/<str:id>/what-would-it-take",
        wit.what_would_it_take,
        name="allocation-what-would-it-take",
    ),
    path("teams/<int:pk>/policy", policies.team_policy, name="team-policy"),
    path("teams/<int:pk>/secrets", secrets.team_secrets, name="team-secrets"),
    path("teams/<int:pk>/secrets/<str:name>", secrets.team_secret, name="team-secret"),
    path("agent/enroll", agent.enroll, name="agent-enroll"),
    path("agent/desired-state", agent.desired_state, name="agent-desired-state"),
    path("agent/report", agent.report, name="agent-report"),
    path("", include(router.urls)),
]
