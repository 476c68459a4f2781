"""The simulator behaves like the hardware where the control plane depends on it: Ampere MIG
toggles pending a reset (D3), profiles hidden while MIG is off (D2), the MPS server and its
clients (D5), the GPU reset, compute mode (D19), lost event registrations (D7), and the probe."""

from __future__ import annotations

import json

import pytest

from hostagent.faults import apply_fault
from hostagent.gpu.backend import InUse, NotSupported
from hostagent.gpu.simulated import DriverQuirks, SimulatedBackend
from hostagent.gpu.simulated.mps import MpsQueued
from hostagent.mps import MpsError, MpsLimits, MpsManager
from tests.hostagent import specs


def backend(*gpus, quirks: DriverQuirks | None = None) -> tuple[SimulatedBackend, list[str]]:
    sim = SimulatedBackend(list(gpus), seed=3, quirks=quirks)
    sim.init()
    return sim, [g.uuid for g in sim.list_gpus()]


def test_an_ampere_mig_toggle_waits_for_a_reset_and_names_what_holds_the_gpu():
    sim, (a100, h100) = backend(specs.a100(), specs.h100(), quirks=DriverQuirks.like_hardware())
    outcome = sim.set_mig_mode(a100, True)
    assert outcome.needs_reset and "nvidia-persistenced" in outcome.message
    gpu = sim.list_gpus()[0]
    assert (gpu.mig_mode_current, gpu.mig_mode_pending) == (False, True)
    sim.reset_gpu(a100)
    assert sim.list_gpus()[0].mig_mode_current is True
    # Hopper switches at once.
    assert sim.set_mig_mode(h100, True) == (True, False, "")
    assert sim.list_gpus()[1].mig_mode_current is True


def test_without_quirks_every_mig_toggle_switches_at_once():
    sim, (a100,) = backend(specs.a100())
    assert sim.set_mig_mode(a100, True).needs_reset is False
    assert sim.list_gpus()[0].mig_mode_current is True


def test_profiles_are_hidden_while_mig_is_off_on_r535_era_drivers():
    sim, (a30,) = backend(specs.a30(), quirks=DriverQuirks(hide_profiles_while_mig_off=True))
    assert sim.possible_placements(a30) == []
    sim.set_mig_mode(a30, True)
    assert {p.profile_id for p in sim.possible_placements(a30)} == {0, 5, 6, 14, 21}


def test_an_mps_client_is_served_by_a_server_process_that_outlives_it(tmp_path):
    sim, (l4,) = backend(specs.l4())
    mps = MpsManager(sim.mps_control, tmp_path)
    mps.ensure(l4, MpsLimits(50))
    plain = sim.run_process(l4, 100, mps=False)
    client = sim.run_process(l4, 2048)
    kinds = {p.pid: p.kind for p in sim.processes(l4)}
    [server] = [pid for pid, kind in kinds.items() if kind == "mps_server"]
    assert kinds[client] == "mps_client" and kinds[plain] == "compute"
    assert sim.mps_control.command(mps.daemon(l4), f"get_client_list {server}") == str(client)
    sim.kill_process(client)
    assert {p.kind for p in sim.processes(l4)} == {"compute", "mps_server"}
    mps.stop(l4)
    assert [p.kind for p in sim.processes(l4)] == ["compute"]


def test_the_mps_server_of_a_mig_instance_keeps_it_busy_like_the_driver(tmp_path):
    sim, (h100,) = backend(specs.h100())
    sim.set_mig_mode(h100, True)
    gi = sim.create_gpu_instance(h100, 9, 0).gpu_instance_id
    ci = sim.create_compute_instance(h100, gi).compute_instance_id
    assert ci is not None
    server = sim.start_mps_server(h100, gpu_instance_id=gi)
    [listed] = sim.processes(h100)
    assert (listed.pid, listed.kind, listed.gpu_instance_id) == (server, "mps_server", gi)
    with pytest.raises(InUse) as exc:
        sim.destroy_compute_instance(h100, gi, ci)
    assert exc.value.pids == (server,)


def test_default_limits_reach_only_servers_spawned_later_as_in_mps(tmp_path):
    sim, (l4,) = backend(specs.l4())
    mps = MpsManager(sim.mps_control, tmp_path)
    mps.ensure(l4, MpsLimits(50))
    sim.run_process(l4, 100)
    daemon = mps.daemon(l4)
    server = sim.mps_control.command(daemon, "get_server_list")
    sim.mps_control.command(daemon, "set_default_active_thread_percentage 25")
    assert sim.mps_control.command(daemon, "get_default_active_thread_percentage") == "25.0"
    assert sim.mps_control.command(daemon, f"get_active_thread_percentage {server}") == "50.0"
    sim.mps_control.command(daemon, f"set_active_thread_percentage {server} 25")
    assert sim.mps_control.command(daemon, f"get_active_thread_percentage {server}") == "25.0"
    with pytest.raises(MpsError):
        sim.mps_control.command(daemon, "set_default_device_pinned_mem_limit GPU-other 1G")


RAISED = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}


def test_a_clients_environment_only_lowers_its_servers_limits(tmp_path):
    sim, (l4,) = backend(specs.l4())
    MpsManager(sim.mps_control, tmp_path).ensure(l4, MpsLimits(30, 4096))
    raised = sim.run_process(l4, 100, env=RAISED)
    lowered = sim.run_process(
        l4,
        100,
        env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G"},
    )
    plain = sim.run_process(l4, 100)
    assert sim.mps_limits(raised) == MpsLimits(30, 4096)
    assert sim.mps_limits(lowered) == MpsLimits(10, 1024)
    assert sim.mps_limits(plain) == MpsLimits(30, 4096)
    assert sim.mps_limits(sim.run_process(l4, 100, mps=False)) is None


def test_without_daemon_limits_the_clients_environment_is_all_there_is(tmp_path):
    sim, (l4,) = backend(specs.l4())
    MpsManager(sim.mps_control, tmp_path).ensure(l4, MpsLimits())
    assert sim.mps_limits(sim.run_process(l4, 100, env=RAISED)) == MpsLimits(100, 80 * 1024)


def test_a_servers_limits_reach_the_clients_that_connect_afterwards(tmp_path):
    sim, (l4,) = backend(specs.l4())
    mps = MpsManager(sim.mps_control, tmp_path)
    mps.ensure(l4, MpsLimits(50, 8192))
    before = sim.run_process(l4, 100)
    daemon = mps.daemon(l4)
    server = sim.mps_control.command(daemon, "get_server_list")
    sim.mps_control.command(daemon, f"set_active_thread_percentage {server} 20")
    sim.mps_control.command(daemon, f"set_device_pinned_mem_limit {server} 0 2G")
    after = sim.run_process(l4, 100, env=RAISED)
    assert sim.mps_limits(before) == MpsLimits(50, 8192)
    assert sim.mps_limits(after) == MpsLimits(20, 2048)


def test_one_server_at_a_time_a_client_of_another_uid_waits_for_the_first_ones_clients(tmp_path):
    """Legacy MPS: "If there's an MPS server already running, but with a different user id
    than that of the client process, the control daemon requests the existing server to
    shutdown as soon as all its clients are done" (nvidia-cuda-mps-control(1))."""
    sim, (l4,) = backend(specs.l4())
    mps = MpsManager(sim.mps_control, tmp_path)
    mps.ensure(l4, MpsLimits())
    first = sim.run_process(l4, 100, uid=1000)
    second = sim.run_process(l4, 100, uid=1000)  # the same user shares the server
    old_server = sim.mps_control.server_pid(l4)
    with pytest.raises(MpsQueued, match="UID 1000"):
        sim.run_process(l4, 100, uid=2000)
    sim.kill_process(first)
    sim.kill_process(second)
    later = sim.run_process(l4, 100, uid=2000)
    assert sim.mps_control.server_pid(l4) not in (None, old_server)
    assert sim.mps_limits(later) == MpsLimits(100, None)


def test_start_server_spawns_a_server_for_a_uid_with_the_defaults_of_that_moment(tmp_path):
    sim, (l4,) = backend(specs.l4())
    mps = MpsManager(sim.mps_control, tmp_path)
    mps.ensure(l4, MpsLimits(40, 1024))
    daemon = mps.daemon(l4)
    assert sim.mps_control.command(daemon, "start_server -uid 1000") == ""
    server = sim.mps_control.command(daemon, "get_server_list")
    assert sim.mps_control.command(daemon, f"get_active_thread_percentage {server}") == "40.0"
    assert sim.mps_control.command(daemon, f"get_device_pinned_mem_limit {server} 0") == "1024M"
    with pytest.raises(MpsError):
        sim.mps_control.command(daemon, "start_server -uid nobody")


def test_a_gpu_reset_is_refused_while_processes_run_and_clears_the_gpu_otherwise():
    sim, (a100,) = backend(specs.a100())
    sim.set_mig_mode(a100, True)
    gi = sim.create_gpu_instance(a100, 9, 0).gpu_instance_id
    sim.create_compute_instance(a100, gi)
    pid = sim.run_process(a100, 100, gpu_instance_id=gi)
    with pytest.raises(InUse) as exc:
        sim.reset_gpu(a100)
    assert exc.value.pids == (pid,)
    sim.kill_process(pid)
    sim.reset_gpu(a100)
    assert sim.mig_instances(a100) == []


def test_the_reset_fault_resets_even_a_busy_gpu_as_a_reboot_does():
    sim, (a100,) = backend(specs.a100())
    sim.run_process(a100, 100)
    apply_fault(sim, {"fault": "reset_gpu", "gpu": 0})
    assert sim.processes(a100) == []


def test_compute_mode_follows_mps_and_cannot_change_in_mig_mode():
    sim, (a30,) = backend(specs.a30())
    sim.set_compute_mode(a30, True)
    assert sim.compute_mode(a30) == "exclusive_process"
    sim.set_compute_mode(a30, False)
    sim.set_mig_mode(a30, True)
    with pytest.raises(NotSupported):
        sim.set_compute_mode(a30, True)


def test_events_are_lost_while_registration_fails_and_flow_once_registered_again():
    sim, (h100, a100) = backend(specs.h100(), specs.a100())
    apply_fault(sim, {"fault": "fail_event_registration", "gpu": 0, "attempts": 1})
    sim.inject_xid(h100, 79)
    sim.inject_xid(a100, 48)
    assert [(e.gpu_uuid, e.xid) for e in sim.wait_events(0)] == [(a100, 48)]
    assert sim.events_lost(h100) == 1
    sim.inject_xid(h100, 79)  # the retry of that wait failed too
    assert sim.wait_events(0) == []
    sim.inject_xid(h100, 79)
    assert [(e.gpu_uuid, e.xid) for e in sim.wait_events(0)] == [(h100, 79)]


def test_a_gpu_reset_drops_the_event_registration_until_the_next_wait():
    sim, (h100,) = backend(specs.h100())
    sim.reset_gpu(h100)
    sim.inject_xid(h100, 79)
    assert sim.wait_events(0) == []
    sim.inject_xid(h100, 79)
    assert [e.xid for e in sim.wait_events(0)] == [79]


def test_the_probe_records_every_gpu_like_the_nvml_probe_and_changes_nothing(tmp_path):
    sim, (a30, l4) = backend(
        specs.a30(), specs.l4(), quirks=DriverQuirks(hide_profiles_while_mig_off=True)
    )
    MpsManager(sim.mps_control, tmp_path).ensure(l4, MpsLimits())
    client = sim.run_process(l4, 512)
    before = (sim.list_gpus(), sim.processes(l4))
    record = sim.probe()
    assert (sim.list_gpus(), sim.processes(l4)) == before
    assert (record["backend"], record["driver_version"]) == ("simulated", sim.driver_version())
    assert record["driver_branch"] == int(sim.driver_version().split(".")[0])
    a30_record, l4_record = record["gpus"]
    assert a30_record["uuid"] == a30 and a30_record["mig_mode"] == {"current": 0, "pending": 0}
    assert a30_record["gpu_instance_profiles"]["answered"] is False
    assert set(a30_record["gpu_instance_profiles"]["errors"].values()) == {"NOT_SUPPORTED"}
    assert [p["pid"] for p in l4_record["processes"]["mps"]] == [client]
    names = {p["pid"]: p["name"] for p in l4_record["processes"]["compute"]}
    assert names.pop(client) == "python3"
    assert list(names.values()) == ["nvidia-cuda-mps-server"]
    assert l4_record["mig_mode"] == "NOT_SUPPORTED" and l4_record["compute_mode"] == 0


def test_the_probe_names_profiles_by_their_nvml_constants_once_mig_is_on():
    sim, (h100,) = backend(specs.h100(), quirks=DriverQuirks(hide_profiles_while_mig_off=True))
    sim.set_mig_mode(h100, True)
    gi = sim.create_gpu_instance(h100, 15, 0).gpu_instance_id
    sim.create_compute_instance(h100, gi)
    [gpu] = sim.probe()["gpus"]
    constants = {p["id"]: p["constant"] for p in gpu["gpu_instance_profiles"]["profiles"]}
    # nvidia-smi IDs 19/20/15/14/9/5/0 are 1_SLICE, 1_SLICE_REV1, 1_SLICE_REV2, 2, 3, 4, 7 (§1.1).
    assert constants == {19: 0, 20: 7, 15: 9, 14: 1, 9: 2, 5: 3, 0: 4}
    [instance] = gpu["gpu_instances"]
    assert (instance["profile_id"], instance["placement"]) == (15, [0, 2])
    assert [d["uuid"] for d in gpu["mig_devices"]] == [sim.mig_instances(h100)[0].uuid]


# -- a restart keeps what the GPU keeps --------------------------------------------------------


def _kept(tmp_path, *gpus) -> tuple[SimulatedBackend, list[str]]:
    sim = SimulatedBackend(list(gpus), seed=3, state_file=tmp_path / "gpus-state.json")
    sim.init()
    return sim, [g.uuid for g in sim.list_gpus()]


def test_a_restarted_agent_finds_the_mig_layout_the_gpu_kept(tmp_path):
    sim, (h100, l4) = _kept(tmp_path, specs.h100(), specs.l4())
    sim.set_mig_mode(h100, True)
    gi = sim.create_gpu_instance(h100, 9, 0)  # 3g.40gb
    sim.create_compute_instance(h100, gi.gpu_instance_id)
    sim.create_gpu_instance(h100, 19, 6)  # 1g.10gb, no compute instance yet
    sim.set_compute_mode(l4, True)
    before = sim.mig_instances(h100)
    again, _ = _kept(tmp_path, specs.h100(), specs.l4())  # the agent restarted
    assert again.mig_instances(h100) == before  # the MIG device's UUID too
    assert again.list_gpus()[0].mig_mode_current is True
    assert again.compute_mode(l4) == "exclusive_process"
    again.destroy_gpu_instance(h100, 2)
    assert [i.gpu_instance_id for i in _kept(tmp_path, specs.h100())[0].mig_instances(h100)] == [1]
    # A reset takes the instances (the MIG mode stays), and the restart sees that too.
    again.destroy_compute_instance(h100, 1, 0)
    again.destroy_gpu_instance(h100, 1)
    again.reset_gpu(h100)
    third, _ = _kept(tmp_path, specs.h100(), specs.l4())
    assert third.mig_instances(h100) == [] and third.list_gpus()[0].mig_mode_current is True
    assert third.compute_mode(l4) == "exclusive_process"  # another GPU's reset leaves it
    assert (tmp_path / "gpus-state.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"version": 2, "gpus": {}}',
        '{"version": 1, "gpus": []}',
        "[]",
    ],
)
def test_an_unreadable_state_file_is_ignored(tmp_path, text, caplog):
    (tmp_path / "gpus-state.json").write_text(text)
    sim, (h100,) = _kept(tmp_path, specs.h100())
    assert sim.mig_instances(h100) == [] and sim.list_gpus()[0].mig_mode_current is False
    assert "ignoring the simulated GPUs' state" in caplog.text


def test_a_gpu_whose_kept_state_is_invalid_starts_fresh_and_the_others_keep_theirs(tmp_path):
    sim, (first, second) = _kept(tmp_path, specs.h100(), specs.h100())
    for gpu in (first, second):
        sim.set_mig_mode(gpu, True)
        sim.create_gpu_instance(gpu, 9, 0)
    path = tmp_path / "gpus-state.json"
    data = json.loads(path.read_text())
    # Two 3g.40gb at the same slices: no driver would hold that.
    overlap = dict(data["gpus"][first]["instances"][0], gpu_instance_id=2)
    data["gpus"][first]["instances"].append(overlap)
    path.write_text(json.dumps(data))
    again, _ = _kept(tmp_path, specs.h100(), specs.h100())
    assert again.mig_instances(first) == [] and again.list_gpus()[0].mig_mode_current is False
    assert [i.profile_id for i in again.mig_instances(second)] == [9]
    for bad in ({"profile_id": 99}, {"start": 1}, {"compute_instances": {"0": "GPU-x"}}):
        data["gpus"][first]["instances"] = [dict(data["gpus"][second]["instances"][0], **bad)]
        path.write_text(json.dumps(data))
        assert _kept(tmp_path, specs.h100(), specs.h100())[0].mig_instances(first) == []


def test_the_agent_keeps_its_simulated_gpus_state_in_its_state_directory(tmp_path):
    from hostagent.config import AgentConfig
    from hostagent.daemon import build_backend

    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps([specs.h100()]))
    config = AgentConfig(simulate=spec, state_dir=tmp_path / "state", mps_dir=tmp_path / "mps")
    sim, _ = build_backend(config)
    sim.init()
    (h100,) = [g.uuid for g in sim.list_gpus()]
    sim.set_mig_mode(h100, True)
    assert (tmp_path / "state" / "simulated-gpus.json").is_file()
    again, _ = build_backend(config)
    again.init()
    assert again.list_gpus()[0].mig_mode_current is True
