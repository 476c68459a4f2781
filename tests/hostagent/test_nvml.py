"""The NVML backend on fake hardware that behaves like real drivers (issue 11, review D1 to D19).

Each test names the review defect it covers; each failed on the backend before the fix.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from hostagent import cli
from hostagent.gpu import nvml as nvml_module
from hostagent.gpu import nvml_telemetry
from hostagent.gpu.backend import (
    BackendError,
    GpuSample,
    GpuUnavailable,
    InUse,
    NotSupported,
    driver_branch,
    normalize_profile_name,
)
from tests.hostagent import specs
from tests.hostagent.contract import nvml_on
from tests.hostagent.fake_gpu import (
    CI_1_SLICE_REV1,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    INSUFFICIENT_RESOURCES,
    LIB_RM_VERSION_MISMATCH,
    NO_PERMISSION,
    UNKNOWN,
    FakeHardware,
)
from tests.hostagent.fake_pynvml import make_fake

INSUFFICIENT_POWER, IRQ_ISSUE = 8, 11
GPM_GAP_S = 0.11  # nvml.h: GPM samples more than 100 ms apart


def on(profile: str = "r570", gpus=None, *, root: bool = True):
    hw = FakeHardware(profile, gpus, root=root)
    return hw, nvml_on(hw)


def uuid_of(hw: FakeHardware, part: str) -> str:
    return next(g.uuid for g in hw.gpus if part in g.name)


def enable_mig_out_of_band(hw: FakeHardware, uuid: str) -> None:
    """An admin's ``nvidia-smi -i GPU -mig 1`` behind the agent's back."""
    g = hw.gpu(uuid)
    g.mig_current = g.mig_pending = True


def gi_with_ci(hw: FakeHardware, uuid: str, profile_id: int, start: int):
    g = hw.gpu(uuid)
    gi = hw.create_gi(g, profile_id, start)
    hw.create_ci(g, gi, max(hw.ci_profiles(g, gi.profile), key=lambda p: p.slices).id)
    return gi


# -- D1: no NVML error kills the agent ----------------------------------------------------


@pytest.mark.parametrize("code", [LIB_RM_VERSION_MISMATCH, NO_PERMISSION, UNKNOWN])
def test_an_init_error_makes_the_host_unavailable_instead_of_crashing(code):
    hw = FakeHardware("r570")
    hw.fail("nvmlInit", code)
    backend = nvml_module.NvmlBackend(library=make_fake(hw))
    with pytest.raises(GpuUnavailable):
        backend.init()
    assert backend.list_gpus() == []


@pytest.mark.parametrize("code", [UNKNOWN, GPU_IS_LOST, INSUFFICIENT_POWER, IRQ_ISSUE])
def test_a_gpu_that_fell_off_the_bus_is_lost_while_the_others_keep_reporting(code):
    hw, backend = on("r570")
    a100 = uuid_of(hw, "A100")
    backend.list_gpus()
    hw.lose_gpu(a100, code)
    statuses = {g.uuid: g.status for g in backend.list_gpus()}
    assert statuses[a100] == "lost"
    assert sorted(statuses.values()) == ["lost", "ok", "ok"]
    assert backend.sample(a100) == GpuSample(uuid=a100, status="lost")
    assert backend.sample(uuid_of(hw, "H100")).status == "ok"


def test_memory_of_a_mig_parent_unreadable_as_non_root_is_an_empty_field():
    hw, backend = on("r570", root=False)
    h100 = uuid_of(hw, "H100")
    enable_mig_out_of_band(hw, h100)
    device = next(g for g in backend.list_gpus() if g.uuid == h100)
    assert (device.status, device.memory_total_mib, device.mig_mode_current) == ("ok", 0, True)
    sample = backend.sample(h100)
    assert (sample.status, sample.memory_total_mib, sample.memory_used_mib) == ("ok", None, None)


def test_the_library_mismatch_of_drivers_before_r510_falls_back_to_the_v2_process_list():
    hw, backend = on("r470")
    a100 = uuid_of(hw, "A100")
    pid = hw.run_process(a100, 1024)
    assert [(p.pid, p.used_memory_mib) for p in backend.processes(a100)] == [(pid, 1024)]
    assert [p.pid for p in backend.sample(a100).processes] == [pid]


def _all_nvml_calls() -> list[str]:
    module = make_fake(FakeHardware("r570"))
    return sorted(n for n in dir(module) if n.startswith("nvml") and n not in ("nvmlInit",))


@pytest.mark.parametrize("code", [UNKNOWN, NO_PERMISSION, GPU_IS_LOST, FUNCTION_NOT_FOUND])
@pytest.mark.parametrize("call", _all_nvml_calls())
def test_no_nvml_error_escapes_the_backend_as_anything_but_a_backend_error(call, code, monkeypatch):
    monkeypatch.setattr(nvml_telemetry, "GPM_MIN_INTERVAL_S", 0.0)
    hw, backend = on("hopper")
    h100, h200 = uuid_of(hw, "H100"), uuid_of(hw, "H200")
    enable_mig_out_of_band(hw, h100)
    gi = gi_with_ci(hw, h100, 9, 0)
    hw.run_process(h100, 512, gpu_instance_id=gi.id)
    hw.start_mps_server(h200)
    backend.sample(h100)  # a GPM baseline, so the next tick computes a metric
    hw.fail(call, code)
    for uuid in (h100, h200):
        for method in ("possible_placements", "mig_instances", "processes"):
            with contextlib.suppress(BackendError):
                getattr(backend, method)(uuid)
        assert isinstance(backend.sample(uuid), GpuSample)
    with contextlib.suppress(BackendError):
        backend.list_gpus()
    with contextlib.suppress(BackendError):
        backend.wait_events(0)


# -- D2: MIG profiles hidden while MIG is off ---------------------------------------------


def test_profiles_hidden_while_mig_is_off_are_found_once_it_is_on():
    hw, backend = on("r535")
    h100 = uuid_of(hw, "H100")
    assert backend.possible_placements(h100) == []
    assert backend.set_mig_mode(h100, True).ok
    assert [p.profile_id for p in backend.possible_placements(h100)] == [0, 5, 9, 14, 15, 19, 20]


def test_an_empty_discovery_is_not_cached_across_an_out_of_band_mig_enable():
    hw, backend = on("r535")
    h100 = uuid_of(hw, "H100")
    assert backend.possible_placements(h100) == []
    enable_mig_out_of_band(hw, h100)
    gi_with_ci(hw, h100, 9, 4)
    assert len(backend.possible_placements(h100)) == 7
    assert [(i.profile_id, i.start) for i in backend.mig_instances(h100)] == [(9, 4)]


def test_the_profile_cache_follows_the_mig_mode():
    hw, backend = on("r535")
    h100 = uuid_of(hw, "H100")
    enable_mig_out_of_band(hw, h100)
    assert len(backend.possible_placements(h100)) == 7
    g = hw.gpu(h100)
    g.mig_current = g.mig_pending = False
    assert backend.possible_placements(h100) == []


# -- D3 and the reset path ----------------------------------------------------------------


def test_an_ampere_toggle_held_by_another_nvml_client_needs_a_reset_and_says_why():
    hw, backend = on("ampere")
    a100 = uuid_of(hw, "A100")
    result = backend.set_mig_mode(a100, True)
    assert (result.ok, result.needs_reset) == (True, True)
    assert "nvidia-persistenced" in result.message and "reset" in result.message
    device = next(g for g in backend.list_gpus() if g.uuid == a100)
    assert (device.mig_mode_current, device.mig_mode_pending) == (False, True)


def test_an_ampere_toggle_with_processes_is_in_use_with_their_pids():
    hw, backend = on("ampere")
    a100 = uuid_of(hw, "A100")
    pid = hw.run_process(a100, 100)
    with pytest.raises(InUse) as exc:
        backend.set_mig_mode(a100, True)
    assert exc.value.pids == (pid,)


def test_a_reset_applies_the_pending_mode_once_the_other_clients_are_gone():
    hw, backend = on("ampere")
    a100 = uuid_of(hw, "A100")
    backend.set_mig_mode(a100, True)
    with pytest.raises(InUse, match="in use by another process"):
        backend.reset_gpu(a100)
    assert backend.available()  # NVML is back after the refused reset
    hw.release_holders(a100)
    backend.reset_gpu(a100)
    assert "nvidia-smi -r -i " + a100 in hw.mutations
    device = next(g for g in backend.list_gpus() if g.uuid == a100)
    assert (device.mig_mode_current, device.mig_mode_pending) == (True, True)
    assert len(backend.possible_placements(a100)) == 7


def test_a_reset_with_processes_running_is_refused_with_their_pids_before_running():
    hw, backend = on("r570")
    l4 = uuid_of(hw, "L4")
    pid = hw.run_process(l4, 100)
    with pytest.raises(InUse) as exc:
        backend.reset_gpu(l4)
    assert exc.value.pids == (pid,)
    assert not any(m.startswith("nvidia-smi") for m in hw.mutations)


def test_a_reset_that_cannot_run_is_a_backend_error_and_nvml_comes_back():
    hw = FakeHardware("r570")

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    backend = nvml_module.NvmlBackend(library=make_fake(hw), run=missing)
    backend.init()
    with pytest.raises(BackendError, match="nvidia-smi"):
        backend.reset_gpu(uuid_of(hw, "L4"))
    assert backend.available() and len(backend.list_gpus()) == 3


# -- D5: the MPS server and its clients ---------------------------------------------------


def test_the_mps_server_and_its_clients_are_told_apart_each_once():
    hw, backend = on("r570")
    l4 = uuid_of(hw, "L4")
    server = hw.start_mps_server(l4)
    client = hw.run_process(l4, 700, mps=True)
    plain = hw.run_process(l4, 300)
    kinds = {p.pid: (p.kind, p.used_memory_mib) for p in backend.processes(l4)}
    assert kinds == {
        server: ("mps_server", 30),
        client: ("mps_client", 700),
        plain: ("compute", 300),
    }


def test_the_mps_server_in_a_mig_instance_is_reported_with_its_instance():
    hw, backend = on("hopper")
    h100 = uuid_of(hw, "H100")
    enable_mig_out_of_band(hw, h100)
    gi = gi_with_ci(hw, h100, 14, 0)
    server = hw.start_mps_server(h100, gpu_instance_id=gi.id)
    hw.run_process(h100, 100, gpu_instance_id=gi.id, mps=True)
    procs = backend.processes(h100)
    assert {p.kind for p in procs} == {"mps_server", "mps_client"}
    assert all(p.gpu_instance_id == gi.id for p in procs)
    assert next(p for p in procs if p.kind == "mps_server").pid == server


# -- D6: temperature before R570 ----------------------------------------------------------


@pytest.mark.parametrize(("profile", "celsius"), [("r535", 34), ("r550", 34), ("r570", 35)])
def test_temperature_is_read_on_every_driver(profile, celsius):
    hw, backend = on(profile)
    assert backend.sample(uuid_of(hw, "H100")).temperature_c == celsius


def test_the_temperature_call_is_chosen_once_per_gpu():
    hw = FakeHardware("r535")
    module = make_fake(hw)
    calls = []
    v_call = module.nvmlDeviceGetTemperatureV
    module.nvmlDeviceGetTemperatureV = lambda *a: calls.append(a) or v_call(*a)
    backend = nvml_module.NvmlBackend(library=module)
    backend.init()
    for _ in range(3):
        for g in hw.gpus:
            backend.sample(g.uuid)
    assert len(calls) == len(hw.gpus)


# -- D7: events ---------------------------------------------------------------------------


def test_one_gpu_failing_registration_does_not_cost_the_others_their_events():
    hw, backend = on("r570")
    h100, a100 = uuid_of(hw, "H100"), uuid_of(hw, "A100")
    hw.fail("nvmlDeviceRegisterEvents", GPU_IS_LOST, gpu=h100, times=1)
    assert backend.wait_events(0) == []
    hw.inject_xid(a100, 79)
    assert [(e.gpu_uuid, e.xid) for e in backend.wait_events(0)] == [(a100, 79)]
    backend.events.retry_s = 0  # the failed GPU is tried again on a later call
    backend.wait_events(0)
    hw.inject_xid(h100, 48)
    assert [(e.gpu_uuid, e.xid) for e in backend.wait_events(0)] == [(h100, 48)]


def test_an_unknown_error_while_registering_rebuilds_the_event_set():
    hw, backend = on("r570")
    h100, a100 = uuid_of(hw, "H100"), uuid_of(hw, "A100")
    hw.fail("nvmlDeviceRegisterEvents", UNKNOWN, gpu=a100, times=1)
    backend.wait_events(0)
    hw.inject_xid(h100, 31)
    assert [e.xid for e in backend.wait_events(0)] == [31]
    assert sum(not es.freed for es in hw.event_sets) == 1


def test_a_gpu_lost_and_back_is_registered_again():
    hw, backend = on("r570")
    a100 = uuid_of(hw, "A100")
    backend.list_gpus()
    backend.wait_events(0)
    hw.lose_gpu(a100, UNKNOWN)
    assert backend.wait_events(0) == []
    hw.restore_gpu(a100)
    backend.wait_events(0)
    hw.inject_xid(a100, 94)
    assert [(e.gpu_uuid, e.xid) for e in backend.wait_events(0)] == [(a100, 94)]


def test_events_flow_again_after_a_reset():
    hw, backend = on("r570")
    l4 = uuid_of(hw, "L4")
    backend.wait_events(0)
    backend.reset_gpu(l4)
    backend.wait_events(0)
    hw.inject_ecc(l4, uncorrected=1)
    assert [(e.kind, e.gpu_uuid) for e in backend.wait_events(0)] == [("ecc", l4)]


# -- D8: the compute-instance profile -----------------------------------------------------


def test_a_two_memory_slice_1g_instance_on_hopper_gets_the_profile_with_the_most_sms():
    hw, backend = on("hopper")
    h100 = uuid_of(hw, "H100")
    backend.set_mig_mode(h100, True)
    gi = backend.create_gpu_instance(h100, 15, 2)
    backend.create_compute_instance(h100, gi.gpu_instance_id)
    (ci,) = hw.gpu(h100).gis[gi.gpu_instance_id].cis.values()
    assert (ci.profile.id, ci.profile.sms) == (CI_1_SLICE_REV1, 26)


def test_the_next_full_size_profile_is_tried_when_the_best_is_refused():
    hw, backend = on("hopper")
    h100 = uuid_of(hw, "H100")
    backend.set_mig_mode(h100, True)
    gi = backend.create_gpu_instance(h100, 15, 0)
    hw.fail("nvmlGpuInstanceCreateComputeInstance", INSUFFICIENT_RESOURCES, arg=CI_1_SLICE_REV1)
    inst = backend.create_compute_instance(h100, gi.gpu_instance_id)
    assert inst.compute_instance_id is not None and inst.uuid
    (ci,) = hw.gpu(h100).gis[gi.gpu_instance_id].cis.values()
    assert (ci.profile.id, ci.profile.sms) == (0, 16)


def test_a_larger_instance_gets_its_full_size_compute_instance_and_never_a_smaller_one():
    hw, backend = on("hopper")
    h100 = uuid_of(hw, "H100")
    backend.set_mig_mode(h100, True)
    gi = backend.create_gpu_instance(h100, 9, 0)
    backend.create_compute_instance(h100, gi.gpu_instance_id)
    (ci,) = hw.gpu(h100).gis[gi.gpu_instance_id].cis.values()
    assert (ci.profile.slices, ci.profile.sms) == (3, 60)
    with pytest.raises(BackendError):
        backend.create_compute_instance(h100, gi.gpu_instance_id)
    assert len(hw.gpu(h100).gis[gi.gpu_instance_id].cis) == 1


# -- D12: GPM samples ---------------------------------------------------------------------


def _hopper_with_gi(profile_id: int = 19, start: int = 0):
    hw, backend = on("hopper")
    h100 = uuid_of(hw, "H100")
    enable_mig_out_of_band(hw, h100)
    gi = gi_with_ci(hw, h100, profile_id, start)
    hw.run_process(h100, 100, gpu_instance_id=gi.id, compute_percent=40)
    return hw, backend, h100, gi


def test_a_failed_gpm_sample_is_freed():
    hw, backend, h100, _ = _hopper_with_gi()
    hw.fail("nvmlGpmMigSampleGet", UNKNOWN)
    for _ in range(3):
        assert [m.utilization_percent for m in backend.sample(h100).mig] == [None]
    assert hw.gpm_live == {}


def test_gpm_baselines_of_destroyed_instances_are_freed():
    hw, backend, h100, gi = _hopper_with_gi()
    backend.sample(h100)
    assert len(hw.gpm_live) == 1
    for p in list(hw.gpu(h100).procs):
        hw.kill_process(p)
    backend.destroy_compute_instance(h100, gi.id, 0)
    backend.destroy_gpu_instance(h100, gi.id)
    backend.sample(h100)
    assert hw.gpm_live == {}


def test_an_instance_made_again_elsewhere_with_the_same_id_is_not_diffed_against_the_old():
    hw, backend, h100, gi = _hopper_with_gi(19, 0)
    backend.sample(h100)
    hw.kill_process(next(iter(hw.gpu(h100).procs)))
    g = hw.gpu(h100)
    hw.destroy_ci(g, gi, gi.cis[0])
    hw.destroy_gi(g, gi)
    again = gi_with_ci(hw, h100, 14, 2)
    assert again.id == gi.id
    time.sleep(GPM_GAP_S)
    assert [m.utilization_percent for m in backend.sample(h100).mig] == [None]  # new baseline
    time.sleep(GPM_GAP_S)
    assert [m.utilization_percent for m in backend.sample(h100).mig] == [0.0]


def test_one_gpm_reading_per_instance_per_tick_is_shared_by_its_compute_instances():
    hw = FakeHardware("hopper")
    module = make_fake(hw)
    reads = []
    mig_sample_get = module.nvmlGpmMigSampleGet
    module.nvmlGpmMigSampleGet = lambda *a: reads.append(a[1]) or mig_sample_get(*a)
    backend = nvml_module.NvmlBackend(library=module)
    backend.init()
    h100 = uuid_of(hw, "H100")
    enable_mig_out_of_band(hw, h100)
    g = hw.gpu(h100)
    gi = hw.create_gi(g, 9, 0)
    hw.create_ci(g, gi, 0)
    hw.create_ci(g, gi, 0)
    hw.run_process(h100, 100, gpu_instance_id=gi.id, compute_percent=70)
    backend.sample(h100)
    time.sleep(GPM_GAP_S)
    sample = backend.sample(h100)
    assert [(m.compute_instance_id, m.utilization_percent) for m in sample.mig] == [
        (0, 70.0),
        (1, 70.0),
    ]
    assert reads == [gi.id, gi.id]


# -- D13: per-profile discovery -----------------------------------------------------------


def test_one_unreadable_profile_is_skipped_and_the_rest_are_not_cached_as_complete():
    hw, backend = on("r570")
    h100 = uuid_of(hw, "H100")
    hw.fail("nvmlDeviceGetGpuInstancePossiblePlacements", NO_PERMISSION, arg=20, times=1)
    assert [p.profile_id for p in backend.possible_placements(h100)] == [0, 5, 9, 14, 15, 19]
    assert [p.profile_id for p in backend.possible_placements(h100)] == [0, 5, 9, 14, 15, 19, 20]


def test_one_profile_constant_without_permission_does_not_blank_the_gpu():
    hw, backend = on("r570")
    h100 = uuid_of(hw, "H100")
    hw.fail("nvmlDeviceGetGpuInstanceProfileInfo", NO_PERMISSION, arg=0, times=1)
    assert 19 not in [p.profile_id for p in backend.possible_placements(h100)]
    assert 19 in [p.profile_id for p in backend.possible_placements(h100)]


def test_a_non_root_agent_sees_no_placements_and_does_not_fail():
    hw, backend = on("r570", root=False)
    assert backend.possible_placements(uuid_of(hw, "H100")) == []


# -- D14: drivers before R510 -------------------------------------------------------------


def test_drivers_before_r510_are_read_with_the_version_1_structs():
    hw, backend = on("r470")
    a100 = uuid_of(hw, "A100")
    enable_mig_out_of_band(hw, a100)
    profiles = backend.possible_placements(a100)
    assert [(p.profile_id, p.name) for p in profiles] == [
        (p["id"], p["name"]) for p in sorted(specs.a100()["profiles"], key=lambda p: p["id"])
    ]
    gi = backend.create_gpu_instance(a100, 9, 4)
    inst = backend.create_compute_instance(a100, gi.gpu_instance_id)
    assert (inst.profile_id, inst.start, inst.compute_instance_id) == (9, 4, 0)


@pytest.mark.parametrize(
    ("version", "branch"),
    [
        ("535.183.01", 535),
        ("570.86.10", 570),
        (" 550.54.15\n", 550),
        ("1020.1", 1020),
        ("", None),
        (None, None),
        ("N/A", None),
    ],
)
def test_the_driver_branch_is_read_from_the_driver_version(version, branch):
    assert driver_branch(version) == branch


def test_the_backend_reports_the_driver_version_a_minimum_can_be_checked_against():
    _, backend = on("r535")
    assert driver_branch(backend.driver_version()) == 535


# -- D18: profile names -------------------------------------------------------------------


def test_raw_nvml_profile_names_reach_the_server_without_the_mig_prefix():
    hw, backend = on("r570")
    names = {p.name for p in backend.possible_placements(uuid_of(hw, "H100"))}
    assert names == {p["name"] for p in specs.h100()["profiles"]}
    assert normalize_profile_name("MIG 1g.10gb+me") == "1g.10gb+me"
    assert normalize_profile_name("mig-3g.40gb") == "3g.40gb"


# -- D19: compute mode --------------------------------------------------------------------


def test_whole_gpu_mps_gets_exclusive_process_and_mig_refuses_a_compute_mode():
    hw, backend = on("r570")
    l4, h100 = uuid_of(hw, "L4"), uuid_of(hw, "H100")
    backend.set_compute_mode(l4, True)
    assert hw.gpu(l4).compute_mode == 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    backend.set_compute_mode(l4, False)
    assert hw.gpu(l4).compute_mode == 0
    enable_mig_out_of_band(hw, h100)
    with pytest.raises(NotSupported):
        backend.set_compute_mode(h100, True)


def test_a_compute_mode_refused_for_lack_of_permission_is_a_backend_error():
    hw, backend = on("r570", root=False)
    with pytest.raises(BackendError):
        backend.set_compute_mode(uuid_of(hw, "L4"), True)


# -- the probe ----------------------------------------------------------------------------


def _busy_host(profile: str):
    hw, backend = on(profile)
    h100 = next((g.uuid for g in hw.gpus if "H100" in g.name), None)
    if h100 is not None:
        enable_mig_out_of_band(hw, h100)
        gi = gi_with_ci(hw, h100, 15, 0)
        hw.start_mps_server(h100, gpu_instance_id=gi.id)
        hw.run_process(h100, 256, gpu_instance_id=gi.id, mps=True)
        gi_with_ci(hw, h100, 9, 4)
    hw.run_process(hw.gpus[-1].uuid, 100)
    return hw, backend


def test_the_probe_records_the_host_and_changes_nothing():
    hw, backend = _busy_host("hopper")
    before = backend.list_gpus()
    hw.mutations.clear()
    record = backend.probe()
    assert hw.mutations == []
    assert backend.list_gpus() == before
    assert json.loads(json.dumps(record)) == record
    assert (record["driver_version"], record["driver_branch"]) == ("570.133.20", 570)
    h100 = record["gpus"][0]
    assert h100["supports"]["nvmlDeviceGetTemperatureV"] is True
    assert h100["gpm_supported"] is True
    assert h100["gpu_instance_profiles"]["answered"]
    assert {p["name"] for p in h100["gpu_instance_profiles"]["profiles"]} >= {"MIG 1g.20gb"}
    one_g = next(gi for gi in h100["gpu_instances"] if gi["profile_id"] == 15)
    assert [(p["id"], p["multiprocessor_count"]) for p in one_g["compute_instance_profiles"]] == [
        (0, 16),
        (CI_1_SLICE_REV1, 26),
    ]
    names = {p["name"] for p in h100["processes"]["compute"]}
    assert "/usr/bin/nvidia-cuda-mps-server" in names
    assert len(h100["processes"]["mps"]) == 1


def test_the_probe_shows_what_an_r535_driver_hides_and_lacks():
    _, backend = on("r535")
    record = backend.probe()
    h100 = record["gpus"][0]
    assert h100["gpu_instance_profiles"]["answered"] is False
    assert set(h100["gpu_instance_profiles"]["errors"].values()) == {"NOT_SUPPORTED"}
    assert h100["supports"]["nvmlDeviceGetTemperatureV"] == "FUNCTION_NOT_FOUND"
    assert h100["supports"]["nvmlDeviceGetTemperature"] is True


def test_the_probe_survives_a_lost_gpu_and_a_host_without_a_driver():
    hw, backend = on("r570")
    hw.lose_gpu(uuid_of(hw, "A100"), UNKNOWN)
    record = backend.probe()
    assert [g["status"] for g in record["gpus"]] == ["ok", "lost", "ok"]
    assert record["gpus"][1]["error"] == "UNKNOWN"
    bare = nvml_module.NvmlBackend(library=make_fake(FakeHardware(), library_present=False))
    with pytest.raises(GpuUnavailable):
        bare.init()
    assert bare.probe()["available"] is False


@pytest.mark.parametrize("profile", ["r470", "r535", "r550", "r570", "ampere", "hopper"])
def test_a_probe_record_replays_as_fake_hardware_that_probes_the_same(profile):
    _, backend = _busy_host(profile)
    record = backend.probe()
    replay = nvml_on(FakeHardware.from_probe(json.loads(json.dumps(record))))
    assert replay.probe() == record


def test_a_replayed_record_drives_the_backend_like_the_host_it_came_from():
    hw, backend = _busy_host("hopper")
    replay_hw = FakeHardware.from_probe(backend.probe())
    replay = nvml_on(replay_hw)
    h100 = uuid_of(hw, "H100")
    assert replay.mig_instances(h100) == backend.mig_instances(h100)
    assert replay.processes(h100) == backend.processes(h100)
    assert replay.possible_placements(h100) == backend.possible_placements(h100)


def test_fleet_agent_probe_json_prints_the_record(monkeypatch, capsys):
    hw = FakeHardware("r550")
    monkeypatch.setattr(nvml_module, "pynvml", make_fake(hw))
    assert cli.main(["--probe", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["driver_version"] == "550.127.05"
    assert [g["name"] for g in record["gpus"]] == [g.name for g in hw.gpus]
    assert hw.mutations == []
    assert not hw.initialised  # NVML released afterwards


def test_fleet_agent_probe_without_a_driver_says_so_and_fails(monkeypatch, capsys):
    monkeypatch.setattr(nvml_module, "pynvml", make_fake(FakeHardware(), library_present=False))
    assert cli.main(["--probe"]) == 1
    assert json.loads(capsys.readouterr().out)["available"] is False
