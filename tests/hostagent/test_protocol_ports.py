"""The ports of the wire contract: what a workload may declare, what an agent may report (a
hostile agent's report is refused or its ports left unstored), and the environment a
replica's program reads its ports from."""

from __future__ import annotations

import pytest

from hostagent import protocol
from hostagent.protocol import ProtocolError, default_health, default_workload


def _workload(**changes):
    w = default_workload()
    w.update(runtime="process", command=["serve"])
    w.update(changes)
    return w


def _status(**changes):
    status = {
        "allocation_id": 3,
        "state": "running",
        "started_at": 1.0,
        "exit_code": None,
        "restarts": 0,
        "message": "",
        "pids": [],
        "ports": {"http": 20001},
    }
    status.update(changes)
    return {"type": "workloads", "ts": 1.0, "full": False, "workloads": [status]}


def test_declared_ports_pass_the_rules_and_the_type() -> None:
    w = _workload(ports=[{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}])
    assert protocol.validate(w, protocol.Workload) == w
    assert protocol.workload_problems(w) == []


@pytest.mark.parametrize(
    "ports",
    [
        [{"name": "HTTP", "port": 8080}],  # names are lower case (FLEET_PORT_HTTP)
        [{"name": "http", "port": 0}],
        [{"name": "http", "port": 65536}],
        [{"name": "a-b", "port": 80}],
        [{"name": f"p{i}", "port": 8000 + i} for i in range(protocol.MAX_PORTS + 1)],
    ],
)
def test_ports_out_of_bounds_are_refused_by_the_type(ports) -> None:
    with pytest.raises(ProtocolError):
        protocol.validate(_workload(ports=ports), protocol.Workload)


@pytest.mark.parametrize(
    ("ports", "health_port", "message"),
    [
        ([{"name": "http", "port": 80}, {"name": "http", "port": 81}], None, "name of its own"),
        ([{"name": "a", "port": 80}, {"name": "b", "port": 80}], None, "declared once"),
        ([{"name": "health", "port": 80}], 81, "is taken: declare it"),
        ([{"name": f"p{i}", "port": 8000 + i} for i in range(8)], 9999, "At most 8"),
    ],
)
def test_rules_of_ports_a_type_cannot_say(ports, health_port, message) -> None:
    health = None
    if health_port is not None:
        health = default_health()
        health["tcp"] = {"port": health_port}
    problems = protocol.workload_problems(_workload(ports=ports, health=health))
    assert [f for f, _ in problems] == ["ports"]
    assert message in problems[0][1]


def test_a_workload_may_not_set_the_port_variables_itself() -> None:
    problems = protocol.workload_problems(_workload(env={"FLEET_HOST_PORT_HTTP": "1"}))
    assert [f for f, _ in problems] == ["env.FLEET_HOST_PORT_HTTP"]


def test_a_health_check_port_is_a_declared_port_named_health_unless_declared() -> None:
    health = default_health()
    health["http"] = {"port": 8080, "path": "/"}
    assert protocol.declared_ports(_workload(health=health)) == [{"name": "health", "port": 8080}]
    named = _workload(health=health, ports=[{"name": "web", "port": 8080}])
    assert protocol.declared_ports(named) == [{"name": "web", "port": 8080}]


def test_the_environment_says_the_port_to_listen_on_and_the_host_port() -> None:
    ports = [{"name": "http", "port": 8080}, {"name": "grpc", "port": 9000}]
    host = {"http": 20001, "grpc": 20002}
    assert protocol.port_environment(ports, host, in_container=True) == {
        "PORT": "8080",
        "FLEET_PORT_HTTP": "8080",
        "FLEET_HOST_PORT_HTTP": "20001",
        "FLEET_PORT_GRPC": "9000",
        "FLEET_HOST_PORT_GRPC": "20002",
    }
    process = protocol.port_environment(ports, host, in_container=False)
    assert process["PORT"] == process["FLEET_PORT_HTTP"] == "20001"


def test_a_report_with_ports_validates() -> None:
    assert protocol.validate_message(_status())["workloads"][0]["ports"] == {"http": 20001}
    old_agent = _status()
    del old_agent["workloads"][0]["ports"]
    assert "ports" not in protocol.validate_message(old_agent)["workloads"][0]


@pytest.mark.parametrize(
    "ports",
    [
        {"http": 0},
        {"http": 70000},
        {"http": -1},
        {"http": "20001"},
        {"Bad Name": 20001},
        {f"p{i}": 20000 + i for i in range(protocol.MAX_PORTS + 1)},
    ],
)
def test_a_hostile_report_of_ports_is_refused(ports) -> None:
    with pytest.raises(ProtocolError):
        protocol.validate_message(_status(ports=ports))


def test_reported_ports_are_stored_only_when_declared_and_not_another_replicas() -> None:
    declared = [{"name": "http", "port": 8080}]
    assert protocol.report_port_problems({"http": 20001}, declared, {}) is None
    assert "not declared" in protocol.report_port_problems({"ssh": 22}, declared, {})
    taken = protocol.report_port_problems({"http": 20001}, declared, {20001: 9})
    assert taken == "port 20001 (http) is held by allocation 9 on this host"
    two = [*declared, {"name": "b", "port": 81}]
    assert "one port" in protocol.report_port_problems({"http": 5, "b": 5}, two, {})
