from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import DynamicRoute, SimpleRouter

from fleet.api import (
    views,
    views_agent,
    views_alerts,
    views_capacity,
    views_deployments,
    views_logs,
    views_mig,
    views_policy,
    views_prometheus,
    views_rollouts,
    views_secrets,
    views_teams,
    views_usage,
)


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
router.register("hosts", views.HostViewSet, basename="host")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("partitions", views.PartitionViewSet, basename="partition")
router.register("deployments", views_deployments.DeploymentViewSet, basename="deployment")
router.register("allocations", views_deployments.AllocationViewSet, basename="allocation")
router.register("operations", views.OperationViewSet, basename="operation")
router.register("events", views.HealthEventViewSet, basename="event")
router.register("tokens", views.ApiTokenViewSet, basename="token")
router.register("alerts/webhooks", views_alerts.WebhookViewSet, basename="webhook")
router.register("alerts/deliveries", views_alerts.DeliveryViewSet, basename="delivery")
router.register("teams", views_teams.TeamViewSet, basename="team")

urlpatterns = [
    path("me", views.me, name="me"),
    path("usage", views_usage.UsageView.as_view(), name="usage"),
    path("prometheus/targets", views_prometheus.targets, name="prometheus-targets"),
    path("capacity/", views_capacity.capacity, name="capacity"),
    path("capacity/repack", views_capacity.capacity_repack, name="capacity-repack"),
    path("capacity/advice", views_capacity.capacity_advice, name="capacity-advice"),
    path("rollouts/", views_rollouts.rollouts, name="rollouts"),
    path("rollouts/<int:pk>/", views_rollouts.rollout, name="rollout"),
    path("rollouts/<int:pk>/resume", views_rollouts.rollout_resume, name="rollout-resume"),
    path("rollouts/<int:pk>/abort", views_rollouts.rollout_abort, name="rollout-abort"),
    path("mig/catalog/", views_mig.catalog, name="mig-catalog"),
    path("mig/validate", views_mig.validate, name="mig-validate"),
    path("mig/migparted", views_mig.migparted_import, name="mig-migparted"),
    path("gpus/<int:pk>/migparted", views_mig.migparted_export, name="gpu-migparted"),
    path("allocations/<int:pk>/logs", views_logs.allocation_logs, name="allocation-logs"),
    path("teams/<int:pk>/policy", views_policy.team_policy, name="team-policy"),
    path("teams/<int:pk>/secrets", views_secrets.team_secrets, name="team-secrets"),
    path("teams/<int:pk>/secrets/<str:name>", views_secrets.team_secret, name="team-secret"),
    path("agent/enroll", views_agent.enroll, name="agent-enroll"),
    path("agent/desired-state", views_agent.desired_state, name="agent-desired-state"),
    path("agent/report", views_agent.report, name="agent-report"),
    path("", include(router.urls)),
]
