from __future__ import annotations

from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "fleet.endpoints"
    label = "endpoints"
    verbose_name = "Endpoints"
