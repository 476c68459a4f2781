"""Host ports for replicas: the agent's range, unique ports, what a replica keeps, and a full
range that fails the replica with a reason instead of crashing the agent."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from hostagent.protocol import default_health, default_security
from hostagent.runtime import Supervisor
from hostagent.runtime.ports import PortAllocator, PortRange, PortsExhausted, bindable
from hostagent.runtime.store import ReplicaStore, Stored
from tests.hostagent.runtime.fakes import FakeRuntime, spec, wait_for
from tests.hostagent.runtime.kit import FAST

HTTP = [{"name": "http", "port": 8080}]
TWO = [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}]


@pytest.mark.parametrize(
    ("text", "first", "last"), [("20000-29999", 20000, 29999), (" 1024-1024 ", 1024, 1024)]
)
def test_a_range_is_first_dash_last(text, first, last) -> None:
    assert PortRange.parse(text) == PortRange(first, last)


@pytest.mark.parametrize("text", ["", "20000", "a-b", "30000-20000", "80-90", "60000-70000"])
def test_a_malformed_or_privileged_range_is_refused_with_the_reason(text) -> None:
    with pytest.raises(ValueError, match=r"range|expected"):
        PortRange.parse(text)


def test_each_declared_port_gets_a_port_of_the_range_that_no_other_replica_holds() -> None:
    allocator = PortAllocator(PortRange(20000, 20003))
    ports = allocator.allocate(TWO, kept={}, taken={20000})
    assert set(ports) == {"http", "metrics"}
    assert len(set(ports.values())) == 2
    assert all(20001 <= p <= 20003 for p in ports.values())


def test_a_replica_keeps_the_ports_it_has() -> None:
    allocator = PortAllocator(PortRange(20000, 20009))
    assert allocator.allocate(TWO, kept={"http": 20005}, taken={20000}) == {
        "http": 20005,
        "metrics": 20001,
    }


def test_a_full_range_raises_a_clear_error_and_gives_nothing() -> None:
    allocator = PortAllocator(PortRange(20000, 20001))
    with pytest.raises(PortsExhausted, match=r"no free host port for 'metrics' in --port-range"):
        allocator.allocate(TWO, kept={}, taken={20000})


def test_a_port_something_else_binds_is_skipped() -> None:
    allocator = PortAllocator(PortRange(20000, 20002), probe=lambda port: port != 20000)
    assert allocator.allocate(HTTP, kept={}, taken=set()) == {"http": 20001}


def test_the_probe_sees_a_port_another_program_listens_on() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        assert not bindable("127.0.0.1")(squatter.getsockname()[1])


def test_ports_are_handed_out_round_robin_so_a_freed_port_is_reused_last() -> None:
    allocator = PortAllocator(PortRange(20000, 20002))
    first = allocator.allocate(HTTP, kept={}, taken=set())["http"]
    second = allocator.allocate(HTTP, kept={}, taken=set())["http"]
    assert (first, second) == (20000, 20001)


def ported(allocation_id: int, **changes):
    return spec(allocation_id, ports=HTTP, **changes)


def test_the_supervisor_gives_each_replica_its_own_port_and_reports_it(tmp_path) -> None:
    fake = FakeRuntime()
    sup = Supervisor(
        {"process": fake},
        agent_runtime="process",
        state_dir=tmp_path,
        timing=FAST,
        ports=PortAllocator(PortRange(21000, 21009)),
    )
    sup.start()
    try:
        sup.place("GPU-1", [ported(1), ported(2)])
        wait_for(lambda: sorted(fake.running_ids()) == [1, 2])
        report = sup.take_report(full=True)
        ports = {w["allocation_id"]: w["ports"] for w in report["workloads"]}
        assert ports[1]["http"] != ports[2]["http"]
        assert {ports[1]["http"], ports[2]["http"]} <= set(range(21000, 21010))
        env = fake.specs[1].full_environment()
        assert env["PORT"] == env["FLEET_PORT_HTTP"] == env["FLEET_HOST_PORT_HTTP"]
        assert env["PORT"] == str(ports[1]["http"])
        # Kept where a restarted agent reads them.
        saved = ReplicaStore(tmp_path).load()
        assert {i: s.spec.host_ports for i, s in saved.items()} == ports
    finally:
        sup.close()


def test_a_replica_that_finds_no_free_port_is_failed_with_the_reason_and_the_others_run(
    tmp_path,
) -> None:
    fake = FakeRuntime()
    sup = Supervisor(
        {"process": fake},
        agent_runtime="process",
        timing=FAST,
        ports=PortAllocator(PortRange(21000, 21000)),
    )
    sup.start()
    try:
        sup.place("GPU-1", [ported(1), ported(2)])
        wait_for(lambda: "failed" in sup.states().values() and fake.running_ids())
        [failed] = [i for i, s in sup.states().items() if s == "failed"]
        status = next(
            w for w in sup.take_report(full=True)["workloads"] if w["allocation_id"] == failed
        )
        assert "no free host port" in status["message"] and status["ports"] == {}
        assert fake.running_ids() == [3 - failed]
    finally:
        sup.close()


def test_ports_saved_by_an_earlier_agent_are_kept_when_the_replica_is_given_again(
    tmp_path,
) -> None:
    ReplicaStore(tmp_path).save([Stored(replace(ported(1), host_ports={"http": 21007}), 0)])
    fake = FakeRuntime()
    sup = Supervisor(
        {"process": fake},
        agent_runtime="process",
        state_dir=tmp_path,
        timing=FAST,
        ports=PortAllocator(PortRange(21000, 21009)),
    )
    sup.start()
    try:
        sup.place("GPU-1", [ported(1)])
        sup.authorize(["GPU-1"])
        wait_for(lambda: fake.running_ids() == [1])
        assert fake.specs[1].host_ports == {"http": 21007}
    finally:
        sup.close()


def test_a_health_port_not_declared_gets_a_host_port_named_health() -> None:
    health = default_health()
    health["tcp"] = {"port": 7000}
    s = spec(1, health=health)
    assert s.allocates_ports()
    assert PortAllocator(PortRange(21000, 21000)).allocate(
        [{"name": "health", "port": 7000}], kept={}, taken=set()
    ) == {"health": 21000}


def test_a_host_network_container_binds_its_declared_ports_and_keeps_its_fingerprint() -> None:
    on_host = {**default_security(), "user": "65534:65534", "host_network": True}
    s = replace(spec(1, runtime="container", image="x", ports=HTTP), security=on_host)
    assert not s.allocates_ports() and s.fixed_ports() == {"http": 8080}
    # What an agent older than ports started is adopted, not started again.
    assert replace(s, host_ports=s.fixed_ports()).fingerprint() == s.fingerprint()
    assert replace(ported(1), host_ports={"http": 20001}).fingerprint() != ported(1).fingerprint()
