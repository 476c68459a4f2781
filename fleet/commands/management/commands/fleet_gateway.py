"""``manage.py fleet_gateway``: run a Fleet gateway (HAProxy kept in step with the endpoints)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from fleet.autoscaling.services import autoscale_activate
from fleet.endpoints.gateway import Gateway, GatewayError, default_directory
from fleet.endpoints.haproxy.config import ConfigError, GatewayConfig


class Command(BaseCommand):
    help = (
        "Run a gateway: start HAProxy with the endpoints' backends and keep its servers and "
        "routes in step with the deployments' ready replicas, over its Runtime API (no reload)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--listen", default="0.0.0.0:8080", help="host:port callers reach (0.0.0.0:8080)"
        )
        parser.add_argument(
            "--directory",
            type=Path,
            default=default_directory(),
            help="where the configuration, maps and Runtime API socket live",
        )
        parser.add_argument(
            "--metrics",
            default="127.0.0.1:8405",
            help="HAProxy's Prometheus exporter (host:port; 'none' for none)",
        )
        parser.add_argument(
            "--runtime-api",
            default=None,
            help="drive an HAProxy already running (its Runtime API: a socket path or host:port) "
            "instead of starting one; print its configuration with --print-config",
        )
        parser.add_argument(
            "--name",
            default="",
            help="this gateway's name in the traffic readings (host:listen port by default)",
        )
        parser.add_argument(
            "--no-activator",
            action="store_true",
            help="no activator: a request that finds no replica gets 503 at once, even for a "
            "deployment scaled to zero",
        )
        parser.add_argument("--print-config", action="store_true", help="print and exit")
        parser.add_argument("--interval", type=float, default=0.25, help="seconds between syncs")
        parser.add_argument("--once", action="store_true", help="sync once and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            config = GatewayConfig(
                listen=options["listen"],
                directory=options["directory"],
                slots=int(settings.FLEET_GATEWAY_SLOTS),
                metrics=None if options["metrics"] == "none" else options["metrics"],
            )
        except ConfigError as exc:
            raise CommandError(str(exc)) from exc
        if options["print_config"]:
            from fleet.endpoints.haproxy.config import render

            self.stdout.write(render(config), ending="")
            return
        if not 0.05 <= options["interval"] <= 10:
            raise CommandError("--interval: between 0.05 and 10 seconds")
        gateway = Gateway(
            config,
            runtime_api=options["runtime_api"],
            interval_s=options["interval"],
            name=options["name"][:64],
            activate=None if options["no_activator"] else _activate,
        )
        try:
            gateway.start()
        except GatewayError as exc:
            raise CommandError(str(exc)) from exc
        if options["once"]:
            result = gateway.once()
            gateway.close()
            self.stdout.write(f"{len(result.commands)} change(s), {len(result.errors)} error(s)")
            return
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write(f"gateway on {config.listen}, Runtime API {gateway.api.address}")
        try:
            gateway.run(stop)
        finally:
            gateway.close()


def _activate(slot: int) -> float | None:
    """The activator's question, in its own thread: wake a deployment scaled to zero."""
    close_old_connections()
    try:
        return autoscale_activate(slot=slot)
    finally:
        close_old_connections()
