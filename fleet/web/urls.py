from __future__ import annotations

from django.urls import path

from fleet.web import (
    fragments,
    rates,
    replica_metrics,
    views,
    views_alerts,
    views_capacity,
    views_deployments,
    views_hosts,
    views_rollouts,
    views_teams,
    views_usage,
)

app_name = "web"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("gpus/<int:gpu_id>/", views.gpu_detail, name="gpu"),
    path("gpus/<int:gpu_id>/layout/", views.layout_editor, name="layout"),
    path("operations/", views.operations, name="operations"),
    path("alerts/", views_alerts.alerts, name="alerts"),
    path("deployments/", views_deployments.deployment_list, name="deployments"),
    path(
        "deployments/<int:deployment_id>/",
        views_deployments.deployment_detail,
        name="deployment",
    ),
    path("capacity/", views_capacity.capacity, name="capacity"),
    path("teams/", views_teams.team_list, name="teams"),
    path("teams/<int:team_id>/", views_teams.team_detail, name="team"),
    path("usage/", views_usage.usage, name="usage"),
    path("rollouts/", views_rollouts.rollouts, name="rollouts"),
    path("ui/rollouts", views_rollouts.rollout_rows, name="ui-rollouts"),
    path("ui/capacity", views_capacity.capacity_panel, name="ui-capacity"),
    path("hosts/", views_hosts.host_list, name="hosts"),
    path("hosts/<int:host_id>/", views_hosts.host_detail, name="host"),
    path("ui/cards", fragments.cards, name="ui-cards"),
    path("ui/hosts", fragments.host_groups, name="ui-hosts"),
    path("ui/tray", fragments.tray, name="ui-tray"),
    path("ui/gpu-names", fragments.gpu_names, name="ui-gpu-names"),
    path("ui/replica-rates", rates.replica_rates, name="ui-replica-rates"),
    path("ui/operations", fragments.operation_rows, name="ui-operations"),
    path("ui/deployments", views_deployments.deployment_rows, name="ui-deployments"),
    path(
        "ui/deployments/<int:deployment_id>/panel",
        views_deployments.deployment_panel,
        name="ui-deployment-panel",
    ),
    path("ui/host-rows", views_hosts.host_rows, name="ui-host-rows"),
    path("ui/hosts/<int:host_id>/panel", views_hosts.host_panel, name="ui-host-panel"),
    path(
        "ui/deployments/<int:deployment_id>/metrics",
        replica_metrics.deployment_metrics,
        name="ui-deployment-metrics",
    ),
    path("ui/gpus/<int:gpu_id>/panel", fragments.gpu_panel, name="ui-gpu-panel"),
    path("ui/gpus/<int:gpu_id>/editor", fragments.gpu_editor_model, name="ui-gpu-editor"),
    path("ui/gpus/<int:gpu_id>/history", fragments.gpu_history, name="ui-gpu-history"),
]
