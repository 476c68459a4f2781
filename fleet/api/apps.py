from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "fleet.api"
    label = "api"
    verbose_name = "REST API v1"
