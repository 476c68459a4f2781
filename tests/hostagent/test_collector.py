from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from hostagent import protocol
from hostagent.collector import Collector, ticks
from hostagent.gpu.backend import BackendError, GpuLost, GpuUnavailable
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsLimits, MpsManager
from tests.hostagent import specs
from tests.hostagent.faulty import FaultyBackend, Nvml999


def make(tmp_path, gpus=None):
    sim = SimulatedBackend(gpus or [specs.h100(), specs.a100()], seed=5)
    sim.init()
    mps = MpsManager(sim.mps_control, tmp_path)
    # Health every call: these tests look at transitions, not at how often MPS is asked.
    return sim, mps, Collector(sim, hostname="h", mps=mps, mps_health_every_s=0)


def make_faulty(tmp_path, mps=None, **collector_kwargs):
    sim = FaultyBackend([specs.h100(), specs.a100()], seed=5)
    sim.init()
    manager = mps or MpsManager(sim.mps_control, tmp_path)
    return sim, manager, Collector(sim, hostname="h", mps=manager, **collector_kwargs)


def test_hello_and_telemetry_are_valid_protocol_messages(tmp_path):
    _sim, _, collector = make(tmp_path)
    hello = collector.hello(applied_generation=2)
    protocol.validate_message(hello)
    gpu = hello["gpus"][0]
    assert gpu["possible_placements"]["9"]["placements"] == [[0, 4], [4, 4]]
    assert gpu["mps"]["running"] is False
    telemetry = collector.telemetry()
    protocol.validate_message(telemetry)
    assert [g["status"] for g in telemetry["gpus"]] == ["ok", "ok"]


def test_injected_faults_become_events(tmp_path):
    sim, mps, collector = make(tmp_path)
    h100, a100 = (g.uuid for g in sim.list_gpus())
    mps.ensure(h100, MpsLimits(50, 1024))
    assert collector.events() == []
    sim.inject_xid(h100, 79)
    sim.inject_ecc(a100, uncorrected=2)
    sim.lose_gpu(a100)
    sim.crash_mps(h100)
    events = collector.events()
    for e in events:
        protocol.validate_message(e)
    assert [(e["kind"], e["gpu_uuid"]) for e in events] == [
        ("xid", h100),
        ("ecc", a100),
        ("gpu_lost", a100),
        ("mps_down", h100),
    ]
    assert events[0]["xid"] == 79
    lost = next(g for g in collector.telemetry()["gpus"] if g["uuid"] == a100)
    assert lost["status"] == "lost" and lost["memory_used_mib"] is None
    sim.restore_gpu(a100)
    mps.ensure(h100, MpsLimits(50, 1024))
    assert [e["kind"] for e in collector.events()] == ["gpu_back", "mps_up"]
    ecc = next(g for g in collector.telemetry()["gpus"] if g["uuid"] == a100)
    assert ecc["ecc_uncorrected"] == 2


def test_synthetic_load_is_deterministic_from_seed_and_tick(tmp_path):
    def run():
        sim, _, collector = make(tmp_path, [specs.l4()])
        sim.run_process(sim.list_gpus()[0].uuid, 1000, compute_percent=60)
        return [collector.telemetry()["gpus"][0]["utilization_gpu_percent"] for _ in range(3)]

    first = run()
    assert first == run()
    assert all(u is not None and 0 < u <= 100 for u in first)


def test_fail_apply_and_slow_apply_affect_mutations(tmp_path):
    sim, _, _ = make(tmp_path)
    uuid = sim.list_gpus()[0].uuid
    sim.fail_apply(1)
    with pytest.raises(BackendError, match="injected"):
        sim.set_mig_mode(uuid, True)
    assert sim.set_mig_mode(uuid, True).ok
    sim.slow_apply(0.05)
    t0 = time.monotonic()
    sim.create_gpu_instance(uuid, 0, 0)
    assert time.monotonic() - t0 >= 0.05


class NoDriver(SimulatedBackend):
    def init(self):
        raise GpuUnavailable("libnvidia-ml.so.1 not found")


def test_without_a_driver_heartbeats_continue_with_no_gpus(tmp_path):
    collector = Collector(NoDriver([specs.l4()]), hostname="h")
    hello = collector.hello(0)
    assert hello["gpus"] == [] and hello["driver_version"] is None
    assert collector.telemetry()["gpus"] == []


def test_ticks_follow_a_monotonic_deadline():
    async def run():
        stop = asyncio.Event()
        seen = []
        t0 = time.monotonic()
        async for n in ticks(0.02, stop):
            seen.append(n)
            if n == 4:
                stop.set()
        return seen, time.monotonic() - t0

    seen, elapsed = asyncio.run(run())
    assert seen == [0, 1, 2, 3, 4]
    assert 0.06 <= elapsed < 1.0


# -- D1: no error of one tick kills the agent -------------------------------------------------


def test_a_gpu_that_cannot_be_read_is_reported_unavailable_and_the_others_normally(tmp_path):
    sim, _, collector = make_faulty(tmp_path)
    sim.fail("sample", Nvml999("Unknown Error"), GpuLost("fell off the bus"))
    telemetry = collector.telemetry()
    protocol.validate_message(telemetry)
    assert [g["status"] for g in telemetry["gpus"]] == ["unavailable", "lost"]
    assert telemetry["gpus"][0]["memory_used_mib"] is None
    assert [g["status"] for g in collector.telemetry()["gpus"]] == ["ok", "ok"]


def test_a_failed_enumeration_reports_the_known_gpus_unavailable_without_events(tmp_path):
    sim, _, collector = make_faulty(tmp_path)
    uuids = [g["uuid"] for g in collector.telemetry()["gpus"]]
    sim.fail("list_gpus", BackendError("Unknown Error (999)"), Nvml999("library mismatch"))
    for _ in range(2):
        telemetry = collector.telemetry()
        protocol.validate_message(telemetry)
        assert [(g["uuid"], g["status"]) for g in telemetry["gpus"]] == [
            (u, "unavailable") for u in uuids
        ]
    assert collector.events() == []


def test_a_failing_driver_init_leaves_no_gpus_and_is_retried_later(tmp_path):
    sim = FaultyBackend([specs.l4()])
    # NVMLLibraryMismatchError is a plain Exception, not an NVMLError (review §1).
    sim.fail("init", Nvml999("Driver/library version mismatch"))
    collector = Collector(sim, hostname="h")
    hello = collector.hello(0)
    protocol.validate_message(hello)
    assert hello["gpus"] == [] and hello["driver_version"] is None
    assert collector.telemetry()["gpus"] == [] and collector.events() == []
    assert sim.count("init") == 1  # not again before REINIT_EVERY_S


def test_a_failing_event_wait_still_reports_status_changes(tmp_path):
    sim, _, collector = make_faulty(tmp_path)
    a100 = sim.list_gpus()[1].uuid
    collector.events()
    sim.lose_gpu(a100)
    sim.fail("wait_events", Nvml999("Unknown Error"))
    assert [(e["kind"], e["gpu_uuid"]) for e in collector.events()] == [("gpu_lost", a100)]
    sim.restore_gpu(a100)
    assert [e["kind"] for e in collector.events()] == ["gpu_back"]


def test_each_distinct_failure_is_logged_once_a_minute_not_every_tick(tmp_path, caplog):
    sim, _, collector = make_faulty(tmp_path)
    sim.fail("sample", *[BackendError("Unknown Error")] * 10)
    sim.fail("wait_events", *[BackendError("event set gone")] * 5)
    with caplog.at_level(logging.WARNING, logger="hostagent.collector"):
        for _ in range(5):
            collector.tick()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages  # one per GPU, one for the event wait


# -- D11: the loop's work is bounded ----------------------------------------------------------


def test_one_tick_enumerates_the_gpus_once(tmp_path):
    sim, _, collector = make_faulty(tmp_path)
    before = sim.count("list_gpus")
    messages = collector.tick()
    assert [m["type"] for m in messages] == ["telemetry"]
    assert sim.count("list_gpus") - before == 1


class CountingMps(MpsManager):
    def __init__(self, *args, check_s=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.checks = 0
        self.check_s = check_s
        self.threads = set()

    def healthy(self, target_uuid):
        self.checks += 1
        self.threads.add(threading.get_ident())
        time.sleep(self.check_s)
        return super().healthy(target_uuid)


def test_the_mps_health_check_does_not_run_every_tick(tmp_path):
    sim = FaultyBackend([specs.h100()], seed=5)
    sim.init()
    mps = CountingMps(sim.mps_control, tmp_path)
    collector = Collector(sim, hostname="h", mps=mps)
    mps.ensure(sim.list_gpus()[0].uuid, MpsLimits(50, None))
    for _ in range(20):
        collector.events()
    assert mps.checks == 1
    assert threading.get_ident() not in mps.threads


def test_mps_daemons_are_checked_concurrently(tmp_path):
    sim = FaultyBackend([specs.h100(), specs.a100()], seed=5)
    sim.init()
    mps = CountingMps(sim.mps_control, tmp_path, check_s=0.4)
    collector = Collector(sim, hostname="h", mps=mps, mps_health_every_s=0)
    for gpu in sim.list_gpus():
        mps.ensure(gpu.uuid, MpsLimits(50, None))
    t0 = time.monotonic()
    collector.events()
    assert mps.checks == 2 and len(mps.threads) == 2
    assert time.monotonic() - t0 < 0.75


def test_a_wedged_mps_daemon_delays_one_tick_by_half_a_second_at_most(tmp_path):
    sim = FaultyBackend([specs.h100()], seed=5)
    sim.init()
    mps = CountingMps(sim.mps_control, tmp_path, check_s=1.5)  # a control daemon that hangs
    collector = Collector(sim, hostname="h", mps=mps)
    mps.ensure(sim.list_gpus()[0].uuid, MpsLimits(50, None))
    t0 = time.monotonic()
    collector.tick()
    first = time.monotonic() - t0
    t0 = time.monotonic()
    for _ in range(5):
        collector.tick()
    assert first < 1.0 and time.monotonic() - t0 < 0.3
    collector.close()


def test_the_simulators_processes_are_named_by_their_replica(tmp_path):
    from hostagent.protocol import default_workload
    from tests.hostagent.runtime.kit import allocation, desired, make_host

    host = make_host(tmp_path, {}, "none")
    host.apply(desired(host.gpu, 1, [allocation(4, default_workload())]))
    collector = Collector(host.sim, hostname="h", owners=host.sync.owners)
    [gpu] = collector.telemetry()["gpus"]
    [process] = [p for p in gpu["processes"] if p["kind"] != "mps_server"]
    assert process["allocation_id"] == 4
    protocol.validate_message(collector.telemetry())
