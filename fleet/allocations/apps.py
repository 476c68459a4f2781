from __future__ import annotations

from django.apps import AppConfig


class AllocationsConfig(AppConfig):
    name = "fleet.allocations"
    label = "allocations"
    verbose_name = "Deployments and allocations"
