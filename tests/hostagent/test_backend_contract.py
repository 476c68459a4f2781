"""One contract for every GpuBackend: simulated, NVML over a fake pynvml, NVML on a real GPU."""

from __future__ import annotations

import json
import time

import pytest

from hostagent.gpu.backend import InsufficientResources, InUse, InvalidPlacement, NotSupported
from tests.hostagent.contract import BACKEND_KINDS, Harness, make_harness


@pytest.fixture(params=BACKEND_KINDS)
def harness(request):
    h = make_harness(request.param)
    yield h
    h.backend.shutdown()


@pytest.fixture(params=["simulated", "nvml-fake"])
def pending(request):
    """MIG toggles on Ampere wait for a GPU reset (another NVML client holds the GPU)."""
    h = make_harness(request.param, needs_reset=True)
    yield h
    h.backend.shutdown()


@pytest.fixture
def mutable(harness: Harness) -> Harness:
    if not harness.mutable:
        pytest.skip("never mutate a real GPU")
    return harness


def _gpu(h: Harness, name_part: str):
    return next(g for g in h.backend.list_gpus() if name_part in g.name)


def _enable_mig(h: Harness, name_part: str) -> str:
    uuid = _gpu(h, name_part).uuid
    result = h.backend.set_mig_mode(uuid, True)
    assert (result.ok, result.needs_reset) == (True, False)
    return uuid


def test_discovery_reports_every_gpu_with_its_identity(harness):
    gpus = harness.backend.list_gpus()
    assert gpus
    for g in gpus:
        assert g.uuid.startswith("GPU-")
        assert g.status == "ok"
        assert g.memory_total_mib > 0
        assert g.pci_device_id & 0xFFFF == 0x10DE
        assert (g.mig_mode_current is None) == (not g.mig_capable)
    assert isinstance(harness.backend.driver_version(), str)
    assert isinstance(harness.backend.nvml_version(), str)
    if harness.mutable:
        assert [(g.name, g.pci_device_id, g.mig_capable) for g in gpus] == [
            ("NVIDIA H100 80GB HBM3", 0x233010DE, True),
            ("NVIDIA A100-SXM4-40GB", 0x20B010DE, True),
            ("NVIDIA L4", 0x27B810DE, False),
        ]
        assert [g.mig_mode_current for g in gpus] == [False, False, None]


def test_possible_placements_come_with_their_profiles(harness):
    for g in harness.backend.list_gpus():
        profiles = harness.backend.possible_placements(g.uuid)
        if not g.mig_capable:
            assert profiles == []
            continue
        for p in profiles:
            assert p.placements
            assert all(size == p.memory_slices for _, size in p.placements)
    if harness.mutable:
        by_id = {
            p.profile_id: p for p in harness.backend.possible_placements(_gpu(harness, "H100").uuid)
        }
        assert sorted(by_id) == [0, 5, 9, 14, 15, 19, 20]
        assert by_id[9].placements == ((0, 4), (4, 4))
        assert (by_id[9].compute_slices, by_id[9].max_instances) == (3, 2)
        assert by_id[19].placements == tuple((s, 1) for s in range(7))


def test_gpu_and_compute_instances_are_created_in_explicit_placements(mutable):
    uuid = _enable_mig(mutable, "H100")
    backend = mutable.backend
    gi = backend.create_gpu_instance(uuid, 9, 4)
    assert (gi.profile_id, gi.start, gi.size) == (9, 4, 4)
    backend.create_gpu_instance(uuid, 19, 0)
    backend.create_compute_instance(uuid, gi.gpu_instance_id)
    listed = backend.mig_instances(uuid)
    assert [(i.profile_id, i.start, i.size) for i in listed] == [(19, 0, 1), (9, 4, 4)]
    full = next(i for i in listed if i.profile_id == 9)
    assert full.compute_instance_id is not None
    assert full.uuid is not None and full.uuid.startswith("MIG-")
    assert listed[0].compute_instance_id is None and listed[0].uuid is None


def test_overlapping_or_unlisted_placements_are_refused(mutable):
    uuid = _enable_mig(mutable, "H100")
    backend = mutable.backend
    backend.create_gpu_instance(uuid, 9, 0)
    with pytest.raises(InsufficientResources):
        backend.create_gpu_instance(uuid, 14, 2)
    with pytest.raises(InvalidPlacement):
        backend.create_gpu_instance(uuid, 14, 1)
    backend.create_gpu_instance(uuid, 9, 4)
    with pytest.raises(InsufficientResources):
        backend.create_gpu_instance(uuid, 19, 6)


def test_destroying_a_busy_partition_raises_in_use_with_the_pids(mutable):
    uuid = _enable_mig(mutable, "H100")
    backend = mutable.backend
    gi = backend.create_gpu_instance(uuid, 14, 0).gpu_instance_id
    ci = backend.create_compute_instance(uuid, gi).compute_instance_id
    pid = mutable.sim.run_process(uuid, 2048, gpu_instance_id=gi)
    with pytest.raises(InUse) as exc:
        backend.destroy_compute_instance(uuid, gi, ci)
    assert pid in exc.value.pids
    with pytest.raises(InUse):
        backend.destroy_gpu_instance(uuid, gi)
    mutable.sim.kill_process(pid)
    with pytest.raises(InUse):  # compute instances first, then the GPU instance
        backend.destroy_gpu_instance(uuid, gi)
    backend.destroy_compute_instance(uuid, gi, ci)
    backend.destroy_gpu_instance(uuid, gi)
    assert backend.mig_instances(uuid) == []


def test_mig_mode_cannot_change_while_processes_run(mutable):
    uuid = _gpu(mutable, "A100").uuid
    pid = mutable.sim.run_process(uuid, 1024)
    with pytest.raises(InUse) as exc:
        mutable.backend.set_mig_mode(uuid, True)
    assert pid in exc.value.pids


def test_telemetry_has_values_where_nvml_has_them_and_none_elsewhere(harness):
    for g in harness.backend.list_gpus():
        s = harness.backend.sample(g.uuid)
        assert s.status == "ok"
        assert s.memory_total_mib and s.memory_used_mib is not None
        if g.mig_mode_current:
            assert s.utilization_gpu_percent is None
        else:
            assert s.mig == ()


def test_mig_utilisation_is_none_on_ampere_and_measured_on_hopper(mutable):
    backend = mutable.backend
    for part in ("A100", "H100"):
        uuid = _enable_mig(mutable, part)
        gi = backend.create_gpu_instance(uuid, 19, 0).gpu_instance_id
        backend.create_compute_instance(uuid, gi)
        mutable.sim.run_process(uuid, 512, gpu_instance_id=gi, compute_percent=50)
    a100, h100 = _gpu(mutable, "A100").uuid, _gpu(mutable, "H100").uuid
    backend.sample(a100), backend.sample(h100)
    time.sleep(0.12)  # GPM needs two samples > 100 ms apart
    a, h = backend.sample(a100), backend.sample(h100)
    assert a.utilization_gpu_percent is None and h.utilization_gpu_percent is None
    assert [m.utilization_percent for m in a.mig] == [None]
    assert h.mig[0].utilization_percent is not None and h.mig[0].utilization_percent > 0
    assert h.mig[0].memory_used_mib == 512
    assert h.mig[0].uuid and h.mig[0].uuid.startswith("MIG-")


def test_processes_are_reported_with_their_memory(mutable):
    uuid = _gpu(mutable, "L4").uuid
    pid = mutable.sim.run_process(uuid, 3000)
    procs = mutable.backend.processes(uuid)
    assert [(p.pid, p.used_memory_mib, p.gpu_instance_id) for p in procs] == [(pid, 3000, None)]
    assert mutable.backend.sample(uuid).memory_used_mib == 3000


def test_a_lost_gpu_is_reported_lost_while_the_others_keep_reporting(mutable):
    backend = mutable.backend
    gpus = backend.list_gpus()
    lost = gpus[1].uuid
    mutable.sim.lose_gpu(lost)
    statuses = {g.uuid: g.status for g in backend.list_gpus()}
    assert statuses == {gpus[0].uuid: "ok", lost: "lost", gpus[2].uuid: "ok"}
    assert backend.sample(lost).status == "lost"
    assert backend.sample(lost).memory_used_mib is None
    assert backend.sample(gpus[0].uuid).status == "ok"
    mutable.sim.restore_gpu(lost)
    assert backend.sample(lost).status == "ok"


def test_xid_events_are_delivered_with_their_code(mutable):
    backend = mutable.backend
    assert backend.wait_events(0) == []
    uuid = _gpu(mutable, "H100").uuid
    mutable.sim.inject_xid(uuid, 79)
    events = backend.wait_events(10)
    assert [(e.kind, e.gpu_uuid, e.xid) for e in events] == [("xid", uuid, 79)]


def test_a_mig_change_pending_a_reset_says_so_and_the_reset_applies_it(pending):
    backend = pending.backend
    uuid = _gpu(pending, "A100").uuid
    result = backend.set_mig_mode(uuid, True)
    assert (result.ok, result.needs_reset) == (True, True) and result.message
    g = _gpu(pending, "A100")
    assert (g.mig_mode_current, g.mig_mode_pending) == (False, True)
    pending.before_reset(uuid)
    backend.reset_gpu(uuid)
    g = _gpu(pending, "A100")
    assert (g.mig_mode_current, g.mig_mode_pending) == (True, True)
    assert backend.possible_placements(uuid)


def test_a_reset_is_refused_with_the_pids_while_processes_run(mutable):
    uuid = _gpu(mutable, "L4").uuid
    pid = mutable.sim.run_process(uuid, 100)
    with pytest.raises(InUse) as exc:
        mutable.backend.reset_gpu(uuid)
    assert pid in exc.value.pids


def test_whole_gpu_mps_gets_exclusive_process_compute_mode_and_mig_refuses_one(mutable):
    backend = mutable.backend
    l4 = _gpu(mutable, "L4").uuid
    backend.set_compute_mode(l4, True)
    assert mutable.sim.compute_mode(l4) == "exclusive_process"
    backend.set_compute_mode(l4, False)
    assert mutable.sim.compute_mode(l4) == "default"
    h100 = _enable_mig(mutable, "H100")
    with pytest.raises(NotSupported):
        backend.set_compute_mode(h100, True)


def test_the_probe_is_a_json_record_of_every_gpu_and_changes_nothing(harness):
    backend = harness.backend
    gpus = backend.list_gpus()
    instances = {g.uuid: backend.mig_instances(g.uuid) for g in gpus if g.mig_capable}
    record = backend.probe()
    assert json.loads(json.dumps(record)) == record
    assert record["probe_version"] == 1
    assert isinstance(record["driver_version"], str) and isinstance(record["nvml_version"], str)
    assert [(g["uuid"], g["name"], g["status"]) for g in record["gpus"]] == [
        (g.uuid, g.name, g.status) for g in gpus
    ]
    for g in record["gpus"]:
        assert set(g["processes"]) == {"compute", "mps"}
    assert backend.list_gpus() == gpus
    assert {u: backend.mig_instances(u) for u in instances} == instances
