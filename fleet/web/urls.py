from __future__ import annotations

from django.urls import path

from fleet.web import fragments, views

app_name = "web"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("gpus/<int:gpu_id>/", views.gpu_detail, name="gpu"),
    path("gpus/<int:gpu_id>/layout/", views.layout_editor, name="layout"),
    path("operations/", views.operations, name="operations"),
    path("ui/cards", fragments.cards, name="ui-cards"),
    path("ui/tray", fragments.tray, name="ui-tray"),
    path("ui/operations", fragments.operation_rows, name="ui-operations"),
    path("ui/gpus/<int:gpu_id>/panel", fragments.gpu_panel, name="ui-gpu-panel"),
    path("ui/gpus/<int:gpu_id>/editor", fragments.gpu_editor_model, name="ui-gpu-editor"),
    path("ui/gpus/<int:gpu_id>/history", fragments.gpu_history, name="ui-gpu-history"),
]
