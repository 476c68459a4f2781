from __future__ import annotations

import asyncio
import time

import pytest

from hostagent import protocol
from hostagent.collector import Collector, ticks
from hostagent.gpu.backend import BackendError, GpuUnavailable
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsLimits, MpsManager
from tests.hostagent import specs


def make(tmp_path, gpus=None):
    sim = SimulatedBackend(gpus or [specs.h100(), specs.a100()], seed=5)
    sim.init()
    mps = MpsManager(sim.mps_control, tmp_path)
    return sim, mps, Collector(sim, hostname="h", mps=mps)


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
