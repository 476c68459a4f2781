"""The HAProxy configuration a Fleet gateway runs: written once, never reloaded to follow the fleet.

Every deployment with an endpoint owns one of ``slots`` backends declared here in advance
(``ep_0`` … ``ep_<slots-1>``): HAProxy 2.6 adds and removes *servers* at run time (the Runtime
API's ``add server`` / ``del server``), not backends. Requests reach a backend through two maps
the Runtime API also changes at run time: ``hosts.map`` (the ``Host`` header, port removed,
lower-cased), else ``paths.map`` (the path's first segment, exactly: ``/qwen`` never catches
``/qwen2``). A path endpoint's segment is taken off the path before it is forwarded
(``/qwen/v1/completions`` reaches the copy as ``/v1/completions``, with
``X-Forwarded-Prefix: /qwen``), as a SageMaker container sees ``/invocations``.

What keeps a request from failing while copies come and go:

* a server is set to ``drain`` before its copy stops: it takes no new request, and those in
  flight finish (:mod:`fleet.endpoints.haproxy.sync`);
* ``retry-on conn-failure empty-response`` with ``option redispatch``: a request whose
  connection failed, or whose server closed without a byte, goes to another server (HAProxy
  retries only what it can replay: the request is buffered, ``http-buffer-request``);
* each server has an active TCP check every second, so a copy whose host vanished is out of the
  rotation within ``fall`` seconds, before Fleet marks the host offline.

Sources: HAProxy 2.6 management guide (Runtime API: add/del server, set server state, add/set/
del map) and configuration manual (``retry-on``, ``map_beg``, ``prometheus-exporter``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Backends are named by slot; servers by allocation: both stay ASCII words the CLI never splits.
BACKEND_PREFIX = "ep_"
MAX_SLOTS = 4096
_ADDRESS = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.-]{1,253}):\d{1,5}$")


class ConfigError(ValueError):
    """A gateway setting HAProxy would not take."""


@dataclass(frozen=True)
class GatewayConfig:
    """Where the gateway listens and keeps its files.

    ``listen``: the address callers use (``0.0.0.0:8080``); ``metrics``: HAProxy's Prometheus
    exporter (``127.0.0.1:8405``, ``None`` for none); ``directory``: the socket, maps and pid.
    """

    listen: str
    directory: Path
    slots: int = 256
    metrics: str | None = "127.0.0.1:8405"
    maxconn: int | None = None  # None: HAProxy's own, from the file-descriptor limit
    server_timeout_s: int = 300  # an LLM answer streams for minutes
    check_interval_ms: int = 1000
    check_fall: int = 2
    # The gateway's activator (fleet.endpoints.activator), every backend's backup server: it
    # holds a request that finds no replica while a deployment scaled to zero comes back.
    activator: str | None = None

    def __post_init__(self) -> None:
        for name, address in (
            ("listen", self.listen),
            ("metrics", self.metrics),
            ("activator", self.activator),
        ):
            if address is not None and not _ADDRESS.match(address):
                raise ConfigError(f"{name}: {address!r} is not host:port")
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ConfigError(f"slots: between 1 and {MAX_SLOTS}, not {self.slots}")
        if not str(self.directory).isprintable() or any(c in str(self.directory) for c in " ;#"):
            raise ConfigError("directory: no spaces, ';' or '#' (HAProxy reads them as syntax)")

    @property
    def socket(self) -> Path:
        return self.directory / "admin.sock"

    @property
    def hosts_map(self) -> Path:
        return self.directory / "hosts.map"

    @property
    def paths_map(self) -> Path:
        return self.directory / "paths.map"

    @property
    def config_file(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def pid_file(self) -> Path:
        return self.directory / "haproxy.pid"


ACTIVATOR = "fleet_activator"
"""The backup server's name in every backend (never an ``r<allocation id>`` copy)."""


def backend_name(slot: int) -> str:
    return f"{BACKEND_PREFIX}{slot}"


def slot_of(backend: str) -> int | None:
    """The slot of a backend this gateway declared, else ``None``."""
    digits = backend.removeprefix(BACKEND_PREFIX)
    if backend.startswith(BACKEND_PREFIX) and digits.isdecimal() and len(digits) <= 5:
        return int(digits)
    return None


def render(config: GatewayConfig) -> str:
    """The whole ``haproxy.cfg``."""
    lines = [
        "# Written by fleet-gateway: the fleet's changes arrive over the Runtime API, not here.",
        "global",
        "    master-worker",
        f"    stats socket {config.socket} mode 600 level admin expose-fd listeners",
        "    stats timeout 30s",
        *([f"    maxconn {config.maxconn}"] if config.maxconn else []),
        "",
        "defaults",
        "    mode http",
        "    option http-buffer-request",
        "    option redispatch 1",
        "    retries 3",
        "    retry-on conn-failure empty-response",
        "    timeout connect 2s",
        "    timeout client 60s",
        "    timeout http-request 10s",
        f"    timeout server {config.server_timeout_s}s",
        "    timeout queue 10s",
        "",
        "frontend fleet",
        f"    bind {config.listen}",
        f"    http-request set-var(txn.host_be) req.hdr(host),field(1,:),lower,"
        f"map_str({config.hosts_map})",
        "    http-request set-var(txn.segment) path,field(2,/) if !{ var(txn.host_be) -m found }",
        f"    http-request set-var(txn.path_be) var(txn.segment),map_str({config.paths_map}) "
        "if { var(txn.segment) -m found }",
        # A path endpoint's prefix is taken off, as SageMaker's container sees /invocations: the
        # model server answers /v1/completions, the caller asks /qwen/v1/completions.
        "    http-request set-header X-Forwarded-Prefix /%[var(txn.segment)] "
        "if { var(txn.path_be) -m found }",
        "    http-request set-path %[path,regsub(^/[^/]*/?,/)] if { var(txn.path_be) -m found }",
        "    use_backend %[var(txn.host_be)] if { var(txn.host_be) -m found }",
        "    use_backend %[var(txn.path_be)] if { var(txn.path_be) -m found }",
        "    default_backend fleet_no_endpoint",
        "",
        "backend fleet_no_endpoint",
        "    http-request return status 404 content-type application/json string "
        '"{\\"code\\":\\"endpoint.not_found\\",\\"message\\":\\"No endpoint answers at this '
        'host and path.\\",\\"details\\":{}}"',
    ]
    if config.metrics is not None:
        lines += [
            "",
            "frontend fleet_metrics",
            f"    bind {config.metrics}",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    http-request return status 404",
        ]
    for slot in range(config.slots):
        lines += [
            "",
            f"backend {backend_name(slot)}",
            "    balance leastconn",
            f"    default-server inter {config.check_interval_ms} fall {config.check_fall} rise 1",
            # With no server in the rotation, the caller gets 503 at once, not a queue timeout;
            # with an activator, the request goes to it (a backup server), which holds it while
            # a deployment scaled to zero comes back, then closes without an answer: HAProxy
            # retries it on the copy now up (retry-on empty-response, redispatch).
        ]
        if config.activator is not None:
            lines += [
                f"    http-request set-header X-Fleet-Slot {slot}",
                f"    server {ACTIVATOR} {config.activator} backup",
            ]
    return "\n".join(lines) + "\n"


def write(config: GatewayConfig) -> Path:
    """Write the configuration and empty maps (kept if present: a restarted HAProxy routes as
    before while the gateway catches up)."""
    config.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in (config.hosts_map, config.paths_map):
        if not path.exists():
            path.write_text("")
    tmp = config.config_file.with_suffix(".tmp")
    tmp.write_text(render(config))
    tmp.replace(config.config_file)
    return config.config_file
