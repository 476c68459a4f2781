"""Health checks: an HTTP ``GET`` or a TCP connect to the replica's own address and port, or a
command run by the workload's runtime.

Where a check goes (:func:`check_target`): a container on the agent's bridge network is
reached at its own IP and declared port (its network namespace is its own, so nothing else can
answer there); a process, or a container in the host's network, at ``127.0.0.1`` and its host
port. A process's port lies in the host's network, where anyone may bind it first: the check
passes only when the listening socket is one of the replica's own processes'
(:func:`hostagent.runtime.procfs.session_listens`).
"""

from __future__ import annotations

import http.client
import socket

from hostagent.protocol import clip, declared_ports
from hostagent.runtime import procfs
from hostagent.runtime.base import ReplicaSpec, Running, Runtime

LOOPBACK = "127.0.0.1"


def http_check(port: int, path: str, timeout_s: float, host: str = LOOPBACK) -> str | None:
    """``None`` when ``GET http://<host>:<port><path>`` answers 2xx or 3xx in time (a
    redirect is not followed: the workload answered), else why not."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path, headers={"User-Agent": "fleet-agent"})
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return clip(f"GET :{port}{path}: {type(exc).__name__}: {exc}")
    finally:
        connection.close()
    return None if 200 <= status < 400 else f"GET :{port}{path} answered {status}"


def tcp_check(port: int, timeout_s: float, host: str = LOOPBACK) -> str | None:
    """``None`` when ``<host>:<port>`` accepts a connection in time."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return clip(f"connect :{port}: {exc.strerror or exc}")


def check_target(running: Running, spec: ReplicaSpec, port: int) -> tuple[str, int] | str:
    """``(host, port)`` a check of the declared ``port`` goes to, or why there is none."""
    if spec.bridged():
        if running.address is None:
            return "the container has no address on the agent's network"
        return running.address, port
    name = next((p["name"] for p in declared_ports(spec.workload) if p["port"] == port), None)
    host_port = spec.host_ports.get(name or "") or running.host_ports.get(name or "")
    if spec.allocates_ports() and host_port is None:
        return f"no host port for port {port}"
    return LOOPBACK, host_port or port


def run_check(runtime: Runtime, running: Running, spec: ReplicaSpec) -> str | None:
    """Run the replica's check once; ``None`` when it passed, else why not."""
    health = spec.workload["health"]
    if health is None:
        return None
    timeout_s = float(health["timeout_s"])
    probe = health.get("http") or health.get("tcp")
    if probe is not None:
        target = check_target(running, spec, probe["port"])
        if isinstance(target, str):
            return target
        host, port = target
        if "http" in health:
            failure = http_check(port, health["http"]["path"], timeout_s, host)
        else:
            failure = tcp_check(port, timeout_s, host)
        return failure if failure is not None else _owner_problem(running, spec, port)
    if "exec" in health:
        command = list(health["exec"]["command"])
        try:
            code = runtime.exec_check(running, spec, command, timeout_s)
        except TimeoutError as exc:
            return clip(f"{command[0]}: {exc}")
        return None if code == 0 else clip(f"{command[0]} exited with code {code}")
    return None


def _owner_problem(running: Running, spec: ReplicaSpec, port: int) -> str | None:
    """A process replica's answer counts only from its own listening socket."""
    if spec.workload["runtime"] != "process" or running.pid is None:
        return None
    if procfs.session_listens(port, running.pid):
        return None
    return (
        f"port {port} answered, but no process of this replica listens on it "
        "(another program holds the port)"
    )
