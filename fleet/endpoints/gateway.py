"""A Fleet gateway: one HAProxy, kept in step with the fleet's endpoints.

It writes the configuration (:mod:`fleet.endpoints.haproxy.config`), starts HAProxy in
master-worker mode (or drives one already running, by its Runtime API), then every ``interval_s``
reads the endpoints' copies (:func:`fleet.endpoints.selectors.gateway_routes`) and applies the
difference (:func:`fleet.endpoints.haproxy.sync.sync`): a change Fleet knows reaches the balancer
within about ``interval_s`` plus a sync, well under a second. Several gateways may run, anywhere
the hosts' addresses can be reached: each converges on its own.

Every ``meter_every_s`` it also reads HAProxy's counters and records each copy's request rate,
requests in flight and response time (:mod:`fleet.endpoints.metering`,
:mod:`fleet.endpoints.traffic`): the deployment page and the autoscaler read them.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from django.db import close_old_connections

from fleet.endpoints.activator import Activate, Activator
from fleet.endpoints.haproxy import config as hconfig
from fleet.endpoints.haproxy.runtime import RuntimeApi, RuntimeApiError, read_counters
from fleet.endpoints.haproxy.sync import SyncResult, sync
from fleet.endpoints.metering import Meter
from fleet.endpoints.selectors import gateway_routes
from fleet.endpoints.traffic import traffic_record

logger = logging.getLogger(__name__)


class GatewayError(RuntimeError):
    """The gateway cannot start: no HAProxy, a configuration it refuses, a Runtime API that
    does not answer."""


@dataclass
class Gateway:
    config: hconfig.GatewayConfig
    runtime_api: str | None = None  # an HAProxy someone else runs: its Runtime API address
    haproxy: str = "haproxy"
    interval_s: float = 0.25
    process: subprocess.Popen[bytes] | None = None
    name: str = ""  # how its traffic readings are told apart: host:listen port by default
    meter_every_s: float = 1.0
    meter: Meter = field(default_factory=Meter)
    # What a request that finds no replica asks (fleet.endpoints.activator); None: no activator,
    # such a request is answered 503 by HAProxy at once.
    activate: Activate | None = None
    activator: Activator | None = None

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"{socket.gethostname()}:{self.config.listen.rpartition(':')[2]}"[:64]

    @property
    def api(self) -> RuntimeApi:
        return RuntimeApi(self.runtime_api or self.config.socket)

    def start(self) -> None:
        if self.runtime_api is None:
            binary = shutil.which(self.haproxy)
            if binary is None:
                raise GatewayError(
                    f"{self.haproxy!r} is not installed: apt-get install haproxy (2.6 or later)."
                )
            if self.activate is not None and self.activator is None:
                self.activator = Activator(RuntimeApi(self.config.socket), self.activate)
                self.activator.start()
                self.config = replace(self.config, activator=self.activator.address)
            path = hconfig.write(self.config)
            check = subprocess.run(
                [binary, "-c", "-q", "-f", str(path)], capture_output=True, check=False
            )
            if check.returncode != 0:
                raise GatewayError(f"HAProxy refuses {path}: {check.stderr.decode()[-500:]}")
            self.process = subprocess.Popen([binary, "-W", "-f", str(path)])
        deadline = time.monotonic() + 10
        while True:
            try:
                self.api.command("show", "info")
                return
            except RuntimeApiError as exc:
                if self.process is not None and self.process.poll() is not None:
                    raise GatewayError(f"HAProxy exited ({self.process.returncode})") from exc
                if time.monotonic() > deadline:
                    raise GatewayError(str(exc)) from exc
                time.sleep(0.05)

    def once(self) -> SyncResult:
        close_old_connections()
        return sync(self.api, self.config, gateway_routes())

    def measure(self) -> int:
        """Read HAProxy's counters and record the copies' traffic; the rows written."""
        samples = self.meter.observe(read_counters(self.api), time.monotonic())
        return traffic_record(self.name, samples)

    def run(self, stop: threading.Event) -> None:
        """Sync until ``stop``; a failed round (HAProxy or the database away) is logged and
        retried, never fatal: the balancer keeps routing as it last was."""
        measured = 0.0
        while not stop.is_set():
            try:
                self.once()
                if time.monotonic() - measured >= self.meter_every_s:
                    measured = time.monotonic()
                    self.measure()
            except RuntimeApiError as exc:
                logger.warning("gateway: HAProxy does not answer: %s", exc)
                if self.process is not None and self.process.poll() is not None:
                    logger.error(
                        "gateway: HAProxy exited (%s): restarting it", self.process.returncode
                    )
                    self.start()
            except Exception:
                logger.exception("gateway: a sync failed; the next one retries")
            stop.wait(self.interval_s)

    def close(self, grace_s: float = 10.0) -> None:
        """Stop HAProxy softly: its listeners close, the requests in flight finish."""
        if self.activator is not None:
            self.activator.close()
            self.activator = None
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGUSR1)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def default_directory() -> Path:
    return Path("/var/lib/fleet-gateway")
