from __future__ import annotations

from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "fleet.web"
    label = "web"
    verbose_name = "Fleet dashboard"
