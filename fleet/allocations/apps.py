from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class AllocationsConfig(AppConfig):
    name = "fleet.allocations"
    label = "allocations"
    verbose_name = "Deployments and allocations"

    def ready(self) -> None:
        from fleet.allocations.accounting.usage import close_interval, open_interval
        from fleet.allocations.models import Allocation

        # Chargeback history: every allocation row opens an interval and its deletion, however
        # it is deleted (instance, queryset, cascade), closes it.
        post_save.connect(open_interval, sender=Allocation, dispatch_uid="usage_open")
        post_delete.connect(close_interval, sender=Allocation, dispatch_uid="usage_close")
