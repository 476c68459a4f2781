"""The ports a replica's workload listens on, and the host ports the agent gives each replica.

A workload declares named ports (``{"name": "http", "port": 8080}``): the port its program
listens on inside a container. Each replica then gets a host port of its own per declared port,
chosen by its agent from the agent's ``--port-range`` and unique on the host, so that two
replicas, of one deployment or of two teams, never share (or answer for) a port:

* a container on the agent's bridge network listens on the declared port; Docker publishes it
  on the replica's host port;
* a process (it runs in the host's network) listens on its host port, which
  ``FLEET_PORT_<NAME>`` says;
* a container with the host's network (an admin's ``host_network``) listens on the declared
  port itself: its host port is the declared one, and one copy per host can bind it.

The agent reports each replica's host ports (``WorkloadStatus.ports``); the control plane
checks them (:func:`report_port_problems`) before it stores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from msgspec import Meta

MAX_PORTS = 8
"""Ports a workload may declare (and a report may give for one replica)."""
HEALTH_PORT_NAME = "health"
"""The name of a health check's port that the workload does not declare itself."""
PORT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,14}$"

PortName = Annotated[str, Meta(pattern=PORT_NAME_PATTERN)]
Port = Annotated[int, Meta(ge=1, le=65535)]


class PortSpec(TypedDict):
    """One declared port: its ``name`` (``FLEET_PORT_<NAME>``) and the port the program listens
    on inside its container."""

    name: PortName
    port: Port


def health_port(workload: Mapping[str, Any]) -> int | None:
    """The port of the workload's ``http`` or ``tcp`` health check, if it has one."""
    health = workload.get("health")
    if not isinstance(health, Mapping):
        return None
    for probe in ("http", "tcp"):
        check = health.get(probe)
        if isinstance(check, Mapping) and isinstance(check.get("port"), int):
            return int(check["port"])
    return None


def declared_ports(workload: Mapping[str, Any]) -> list[PortSpec]:
    """The workload's ports, plus its health check's port named ``health`` when it does not
    declare that port itself (so a deployment that only names a health port gets one too)."""
    ports: list[PortSpec] = [
        {"name": str(p["name"]), "port": int(p["port"])} for p in workload.get("ports") or []
    ]
    checked = health_port(workload)
    if checked is not None and all(p["port"] != checked for p in ports):
        ports.append({"name": HEALTH_PORT_NAME, "port": checked})
    return ports


def port_problems(workload: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for each rule the workload's ``ports`` break (after their type was
    checked): unique names, unique ports, a free name for an undeclared health port."""
    problems: list[tuple[str, str]] = []
    ports = list(workload.get("ports") or [])
    if ports and workload.get("runtime") == "none":
        problems.append(("ports", "A workload with runtime 'none' runs nothing: no ports."))
    names = [p["name"] for p in ports]
    numbers = [p["port"] for p in ports]
    if len(set(names)) != len(names):
        problems.append(("ports", "Each port needs a name of its own."))
    if len(set(numbers)) != len(numbers):
        problems.append(("ports", "A port number can be declared once."))
    checked = health_port(workload)
    if checked is not None and checked not in numbers and HEALTH_PORT_NAME in names:
        problems.append(
            (
                "ports",
                f"The health check's port {checked} is not declared, and the name "
                f"'{HEALTH_PORT_NAME}' it would get is taken: declare it.",
            )
        )
    elif len(declared_ports(workload)) > MAX_PORTS:
        problems.append(("ports", f"At most {MAX_PORTS} ports, the health check's included."))
    return problems


def port_environment(
    ports: list[PortSpec], host_ports: Mapping[str, int], *, in_container: bool
) -> dict[str, str]:
    """``PORT`` (the first port to listen on), ``FLEET_PORT_<NAME>`` (the port to listen on:
    the declared one in a container of its own network, else the host port) and
    ``FLEET_HOST_PORT_<NAME>`` (the replica's host port)."""
    env: dict[str, str] = {}
    for spec in ports:
        host = host_ports.get(spec["name"])
        if host is None:
            continue
        listen = spec["port"] if in_container else host
        env.setdefault("PORT", str(listen))
        env[f"FLEET_PORT_{spec['name'].upper()}"] = str(listen)
        env[f"FLEET_HOST_PORT_{spec['name'].upper()}"] = str(host)
    return env


def report_port_problems(
    reported: Mapping[str, int], declared: list[PortSpec], taken: Mapping[int, int]
) -> str | None:
    """Why a replica's reported host ports cannot be stored (``None``: they can): a name its
    workload does not declare, or a port another replica of the host holds (``taken``: host
    port → that replica's allocation ID). The types and the count were checked by the
    codec."""
    names = {p["name"] for p in declared}
    unknown = sorted(set(reported) - names)
    if unknown:
        return f"port name(s) {', '.join(unknown)[:100]} are not declared by the workload"
    for name, port in sorted(reported.items()):
        if port in taken:
            return f"port {port} ({name}) is held by allocation {taken[port]} on this host"
    if len(set(reported.values())) != len(reported):
        return "two names report one port"
    return None
