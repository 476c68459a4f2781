"""``python manage.py demo``: the whole product on embedded defaults.

Migrates, seeds the demo fleet, gives the admin, operator and viewer accounts new passwords of
their own (printed once: handing out the viewer's does not hand out the admin's), starts
simulated agents (one process, one socket per host), a gateway for the endpoints when HAProxy
is installed (:8080), and serves on :8000. In the embedded mode
(no Redis) a scheduler thread does what Celery beat does in production: re-push unacknowledged
generations, expire stuck operations, mark silent hosts offline.
"""

from __future__ import annotations

import atexit
import json
import logging
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from fleet.agents.enrollment import host_issue_token
from fleet.commands.demo_fleet import DEMO_HOSTS, demo_gpu_uuid, seed_demo_fleet
from fleet.core.roles import Role
from fleet.core.services import user_create
from fleet.inventory.models import Host
from fleet.inventory.simulation import simulated_spec
from fleet.mig import product_by_key
from fleet.tasks import (
    advance_workflows,
    autoscale,
    expire_operations,
    mark_offline_hosts,
    place_queue,
    prune_alert_deliveries,
    prune_health_events,
    prune_login_failures,
    reclaim,
    recover_quiet_gpus,
    redeliver,
    retry_alerts,
    retry_replicas,
    telemetry_retention,
    telemetry_rollup,
    wit_refresh,
)

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the whole product on embedded defaults with a demo fleet (http://127.0.0.1:8000)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default="127.0.0.1:8000", help="address:port to serve on")
        parser.add_argument(
            "--no-serve", action="store_true", help="seed and print the login, then exit"
        )
        parser.add_argument(
            "--no-agents", action="store_true", help="do not start simulated agents"
        )
        parser.add_argument(
            "--interval", type=float, default=1.0, help="agent telemetry interval (s)"
        )
        parser.add_argument(
            "--gateway",
            default="127.0.0.1:8080",
            help="where the endpoints' gateway listens when HAProxy is installed (host:port)",
        )
        parser.add_argument("--no-gateway", action="store_true", help="start no gateway")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        seeded = seed_demo_fleet()
        passwords = demo_accounts_reset()
        url = f"http://{options['addr']}"
        logins = "".join(f"\n    {name:<9} password: {pw}" for name, pw in passwords.items())
        self.stdout.write(
            self.style.SUCCESS(f"Fleet demo: {seeded['hosts']} hosts.")
            + f"\n  Open {url}/  (API docs {url}/api/docs/, admin {url}/admin/)"
            + "\n  Sign in with one of these (new passwords each run, shown only here):"
            + logins
            + "\n"
        )
        self.stdout.flush()
        if options["no_serve"]:
            return
        if not options["no_agents"]:
            config = write_swarm_config(url, interval_s=options["interval"])
            start_agents(config)
            self.stdout.write(f"  Simulated agents: {len(DEMO_HOSTS)} hosts (config {config})\n")
        if not options["no_gateway"]:
            self.stdout.write(f"  {start_gateway(options['gateway'])}\n")
        if settings.CELERY_TASK_ALWAYS_EAGER:
            threading.Thread(target=embedded_scheduler, name="fleet-scheduler", daemon=True).start()
        call_command("runserver", options["addr"], use_reloader=False, insecure_serving=True)


DEMO_ACCOUNTS = (("admin", Role.ADMIN), ("operator", Role.OPERATOR), ("viewer", Role.VIEWER))


def demo_accounts_reset() -> dict[str, str]:
    """A new random password for each demo account; returned once, stored only hashed."""
    passwords = {}
    for name, role in DEMO_ACCOUNTS:
        passwords[name] = secrets.token_urlsafe(12)
        user_create(username=name, password=passwords[name], role=role)
    return passwords


def write_swarm_config(server: str, *, interval_s: float) -> Path:
    """Fresh host tokens for the demo hosts and their GPU specs, for ``hostagent.swarm``."""
    hosts = []
    for demo in DEMO_HOSTS:
        host = Host.objects.get(name=demo.name)
        product = product_by_key(demo.product_key)
        assert product is not None
        specs = [
            simulated_spec(product, uuid=demo_gpu_uuid(demo.name, i)) for i in range(demo.gpus)
        ]
        hosts.append({"token": host_issue_token(host), "gpus": specs})
    path = Path(settings.FLEET_DATA_DIR) / "demo-agents.json"
    config = {
        "server": server,
        "interval_s": interval_s,
        "hosts": hosts,
        # The demo's agents run process workloads for real (a deployment whose workload is a
        # process starts it on this machine, as the user running the demo), and stop them
        # when the demo exits.
        "runtime": "process",
        "allow_process_runtime": True,
        "process_as_agent_user": True,
        "state_dir": str(Path(settings.FLEET_DATA_DIR) / "demo-workloads"),
        "stop_workloads_on_exit": True,
        # Their replicas listen on this machine: the demo's gateway reaches them here.
        "address": "127.0.0.1",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def start_gateway(listen: str) -> str:
    """The endpoints' gateway (``manage.py fleet_gateway``: HAProxy kept in step with the
    deployments' ready replicas) when HAProxy is installed; what to tell the user either way."""
    if shutil.which("haproxy") is None:
        return "Endpoints: no gateway (HAProxy is not installed: apt-get install haproxy)."
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(settings.BASE_DIR) / "manage.py"),
            "fleet_gateway",
            "--listen",
            listen,
            "--directory",
            str(Path(settings.FLEET_DATA_DIR) / "gateway"),
            "--metrics",
            "none",
        ]
    )
    atexit.register(process.terminate)  # SIGTERM: HAProxy stops softly
    if not settings.FLEET_GATEWAY_URL:
        settings.FLEET_GATEWAY_URL = f"http://{listen}"
    return f"Endpoints: gateway http://{listen}/ (HAProxy; docs/endpoints.md)."


def start_agents(config: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", "hostagent.swarm", str(config)])
    atexit.register(process.terminate)
    return process


def embedded_scheduler(period_s: float = 2.0) -> None:
    """Celery beat's schedule, run in-process when there is no Redis."""
    stop = threading.Event()
    tick = 0
    while not stop.wait(period_s):
        tick += 1
        try:
            redeliver()
            advance_workflows()
            reclaim()
            if tick % 2 == 0:
                place_queue()
            if tick % 3 == 0:
                wit_refresh()
                autoscale()
                mark_offline_hosts()
                retry_alerts()
            if tick % 5 == 0:
                expire_operations()
                recover_quiet_gpus()
                retry_replicas()
            if tick % 30 == 0:
                telemetry_rollup()
            if tick % 1800 == 0:
                telemetry_retention()
                prune_login_failures()
                prune_health_events()
                prune_alert_deliveries()
        except Exception:  # keep the scheduler alive; log and go on
            logger.exception("embedded scheduler tick failed")
        finally:
            close_old_connections()
