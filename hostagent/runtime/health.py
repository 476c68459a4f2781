"""Health checks: an HTTP ``GET`` or a TCP connect on the host's loopback (containers share the
host's network), or a command run by the workload's runtime."""

from __future__ import annotations

import http.client
import socket

from hostagent.protocol import clip
from hostagent.runtime.base import ReplicaSpec, Running, Runtime


def http_check(port: int, path: str, timeout_s: float) -> str | None:
    """``None`` when ``GET http://127.0.0.1:<port><path>`` answers 2xx or 3xx in time (a
    redirect is not followed: the workload answered), else why not."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", path, headers={"User-Agent": "fleet-agent"})
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return clip(f"GET :{port}{path}: {type(exc).__name__}: {exc}")
    finally:
        connection.close()
    return None if 200 <= status < 400 else f"GET :{port}{path} answered {status}"


def tcp_check(port: int, timeout_s: float) -> str | None:
    """``None`` when ``127.0.0.1:<port>`` accepts a connection in time."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return None
    except OSError as exc:
        return clip(f"connect :{port}: {exc.strerror or exc}")


def run_check(runtime: Runtime, running: Running, spec: ReplicaSpec) -> str | None:
    """Run the replica's check once; ``None`` when it passed, else why not."""
    health = spec.workload["health"]
    if health is None:
        return None
    timeout_s = float(health["timeout_s"])
    if "http" in health:
        return http_check(health["http"]["port"], health["http"]["path"], timeout_s)
    if "tcp" in health:
        return tcp_check(health["tcp"]["port"], timeout_s)
    if "exec" in health:
        command = list(health["exec"]["command"])
        try:
            code = runtime.exec_check(running, spec, command, timeout_s)
        except TimeoutError as exc:
            return clip(f"{command[0]}: {exc}")
        return None if code == 0 else clip(f"{command[0]} exited with code {code}")
    return None
