from __future__ import annotations

from django.apps import AppConfig


class PartitioningConfig(AppConfig):
    name = "fleet.partitioning"
    label = "partitioning"
    verbose_name = "Partitioning (desired state and operations)"
