from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "fleet.core"
    label = "core"
    verbose_name = "Fleet core"

    def ready(self) -> None:
        # Here, not at the top: signals imports models, which Django loads only after the
        # app registry is populated (the documented place to connect signals).
        from fleet.core import signals

        signals.connect()
