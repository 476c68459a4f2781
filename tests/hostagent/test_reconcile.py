from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hostagent import reconcile
from hostagent.gpu.backend import BackendError
from hostagent.gpu.simulated import DriverQuirks, SimulatedBackend
from hostagent.mps import MpsLimits, MpsManager
from hostagent.protocol import DesiredGpu, DesiredState
from hostagent.reconcile import (
    Blocked,
    CreateComputeInstance,
    CreateGpuInstance,
    Deferred,
    DestroyComputeInstance,
    DestroyGpuInstance,
    ResetLedger,
    SetMigMode,
    apply,
    observe,
    plan,
)
from tests.hostagent import specs


def desired(instances=(), mig=True, mps=False, allocations=()) -> DesiredGpu:
    return {
        "mode": "mig" if mig else ("mps" if mps else "dedicated"),
        "mig_enabled": mig,
        "instances": [{"key": f"k{p}@{s}", "profile_id": p, "start": s} for p, s in instances],
        "mps": {
            "enabled": mps,
            "per_instance": False,
            "default_active_thread_percentage": 50 if mps else None,
            "default_pinned_mem_limit_mib": None,
        },
        "allocations": list(allocations),
    }


def sim_a30() -> tuple[SimulatedBackend, str]:
    sim = SimulatedBackend([specs.a30()], seed=1)
    sim.init()
    return sim, sim.list_gpus()[0].uuid


def converge(sim, uuid, want, mps=None):
    results = apply(sim, plan(want, observe(sim, mps, uuid)), True, mps)
    return results, plan(want, observe(sim, mps, uuid))


def test_plan_orders_teardown_before_mode_change_before_creation():
    sim, uuid = sim_a30()
    sim.set_mig_mode(uuid, True)
    gi = sim.create_gpu_instance(uuid, 0, 0).gpu_instance_id
    sim.create_compute_instance(uuid, gi)
    actions = plan(desired([(5, 2), (14, 0), (14, 1)]), observe(sim, None, uuid))
    kinds = [type(a) for a in actions]
    assert kinds == [
        DestroyComputeInstance,
        DestroyGpuInstance,
        CreateGpuInstance,
        CreateGpuInstance,
        CreateGpuInstance,
        CreateComputeInstance,
        CreateComputeInstance,
        CreateComputeInstance,
    ]
    assert [a.start for a in actions if isinstance(a, CreateGpuInstance)] == [0, 1, 2]


def test_enabling_mig_comes_before_creating_instances():
    sim, uuid = sim_a30()
    actions = plan(desired([(0, 0)]), observe(sim, None, uuid))
    assert [type(a) for a in actions] == [SetMigMode, CreateGpuInstance, CreateComputeInstance]
    results, again = converge(sim, uuid, desired([(0, 0)]))
    assert {r["status"] for r in results} == {"ok"}
    assert again == ()


def test_a_partition_with_processes_is_never_destroyed_and_blocks_what_overlaps_it():
    sim, uuid = sim_a30()
    converge(sim, uuid, desired([(5, 0), (5, 2)]))
    gi = next(i for i in sim.mig_instances(uuid) if i.start == 0).gpu_instance_id
    pid = sim.run_process(uuid, 100, gpu_instance_id=gi)
    want = desired([(14, 0), (14, 1), (14, 2), (14, 3)])
    results = reconcile.merge_results(apply(sim, plan(want, observe(sim, None, uuid)), True))
    by_key = {r["key"]: r for r in results}
    assert by_key[f"{uuid}:gi:5@0"]["status"] == "in_use"
    assert by_key[f"{uuid}:gi:5@0"]["pids"] == [pid]
    assert by_key["k14@0"]["status"] == "in_use"
    assert by_key["k14@1"]["status"] == "in_use"
    assert by_key["k14@2"]["status"] == "ok"
    layout = [(i.profile_id, i.start) for i in sim.mig_instances(uuid)]
    assert layout == [(5, 0), (14, 2), (14, 3)]


def test_mig_mode_is_not_changed_while_processes_run():
    sim, uuid = sim_a30()
    pid = sim.run_process(uuid, 100)
    actions = plan(desired([(0, 0)]), observe(sim, None, uuid))
    assert isinstance(actions[0], Blocked) and actions[0].pids == (pid,)
    assert not any(isinstance(a, SetMigMode | CreateGpuInstance) for a in actions)


def test_a_mode_change_pending_reset_is_reported_as_needs_reset():
    sim = SimulatedBackend([specs.a100()], seed=1, mig_change_needs_reset=True)
    uuid = sim.list_gpus()[0].uuid
    results = reconcile.merge_results(
        apply(sim, plan(desired([(9, 0)]), observe(sim, None, uuid)), True)
    )
    assert {r["status"] for r in results} == {"needs_reset"}
    sim.reset_gpu(uuid)
    _, again = converge(sim, uuid, desired([(9, 0)]))
    assert again == ()


def test_without_allow_mutation_every_item_is_refused_and_nothing_changes():
    sim, uuid = sim_a30()
    results = apply(sim, plan(desired([(0, 0)]), observe(sim, None, uuid)), False)
    assert {(r["status"], r["message"]) for r in results} == {("refused", "mutation_disabled")}
    assert sim.list_gpus()[0].mig_mode_current is False


def test_invalid_desired_instances_fail_without_touching_the_rest():
    sim, uuid = sim_a30()
    results, _ = converge(sim, uuid, desired([(5, 1), (14, 0)]))
    by_key = {r["key"]: r["status"] for r in reconcile.merge_results(results)}
    assert by_key["k5@1"] == "failed"
    assert by_key["k14@0"] == "ok"


def test_mps_daemon_is_started_with_its_limits_and_restarted_after_a_crash(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    want = desired(mig=False, mps=True)
    _, again = converge(sim, uuid, want, mps)
    assert again == ()
    assert mps.healthy(uuid) and mps.info(uuid)["default_active_thread_percentage"] == 50
    sim.crash_mps(uuid)
    assert not mps.healthy(uuid)
    _, again = converge(sim, uuid, want, mps)
    assert again == () and mps.healthy(uuid)
    _, again = converge(sim, uuid, desired(mig=False), mps)
    assert again == () and not mps.healthy(uuid)


def test_apply_desired_state_runs_simulated_allocations_on_their_partitions():
    sim, uuid = sim_a30()
    want = desired([(5, 0)])
    want["allocations"] = [
        {
            "key": "a1",
            "gpu_uuid": uuid,
            "partition_key": "k5@0",
            "memory_mib": 4000,
            "max_compute_percent": None,
        }
    ]
    state: DesiredState = {"type": "desired_state", "generation": 1, "gpus": {uuid: want}}
    results = reconcile.apply_desired_state(sim, state, True)
    assert {r["status"] for r in results} == {"ok"}
    [proc] = sim.processes(uuid)
    assert proc.used_memory_mib == 4000 and proc.gpu_instance_id is not None
    # Removing the allocation and the partition in one generation works: stop first.
    state = {"type": "desired_state", "generation": 2, "gpus": {uuid: desired([(0, 0)])}}
    results = reconcile.apply_desired_state(sim, state, True)
    assert {r["status"] for r in results} == {"ok"}
    assert sim.processes(uuid) == []


A30_SLOTS = [(14, 0), (14, 1), (14, 2), (14, 3), (21, 0), (21, 3), (5, 0), (5, 2), (6, 2), (0, 0)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=st.lists(st.sampled_from(A30_SLOTS), max_size=5),
    after=st.lists(st.sampled_from(A30_SLOTS), max_size=5),
    mig_before=st.booleans(),
    mig_after=st.booleans(),
    ci=st.booleans(),
)
def test_plan_is_idempotent_for_any_layouts(before, after, mig_before, mig_after, ci):
    # The control plane never sends two media-extension (+me) instances for one GPU (fleet.mig
    # validates that); the driver would refuse the second, and the agent would retry it.
    assume(len([slot for slot in set(after) if slot[0] in (21, 6)]) <= 1)
    sim, uuid = sim_a30()
    if mig_before:
        sim.set_mig_mode(uuid, True)
        for p, s in before:
            try:
                gi = sim.create_gpu_instance(uuid, p, s).gpu_instance_id
            except Exception:
                continue
            if ci:
                sim.create_compute_instance(uuid, gi)
    want = desired(list(dict.fromkeys(after)), mig=mig_after)
    actions = plan(want, observe(sim, None, uuid))
    results = apply(sim, actions, True)
    assert all(r["status"] in ("ok", "failed") for r in results), results
    again = plan(want, observe(sim, None, uuid))
    assert all(isinstance(a, reconcile.Invalid) for a in again), again
    if mig_after:
        layout = {(i.profile_id, i.start) for i in sim.mig_instances(uuid)}
        valid = {(a.profile_id, a.start) for a in actions if isinstance(a, CreateGpuInstance)}
        assert valid <= layout
        assert all(i.compute_instance_id is not None for i in sim.mig_instances(uuid))
    else:
        assert sim.mig_instances(uuid) == []


def test_drift_is_what_applying_again_would_change_and_blocked_items_are_not_drift():
    sim, uuid = sim_a30()
    state: DesiredState = {
        "type": "desired_state",
        "generation": 1,
        "gpus": {uuid: desired(instances=[(14, 0), (14, 1)])},
    }
    assert reconcile.drifted(sim, state)  # nothing applied yet
    reconcile.apply_desired_state(sim, state, True)
    assert not reconcile.drifted(sim, state)
    lost = next(i for i in sim.mig_instances(uuid) if i.start == 1)
    if lost.compute_instance_id is not None:
        sim.destroy_compute_instance(uuid, lost.gpu_instance_id, lost.compute_instance_id)
    sim.destroy_gpu_instance(uuid, lost.gpu_instance_id)  # as a reboot would
    assert reconcile.drifted(sim, state)
    reconcile.apply_desired_state(sim, state, True)
    assert not reconcile.drifted(sim, state)
    # A layout that would destroy a busy instance is blocked: applying again changes nothing.
    busy = next(i for i in sim.mig_instances(uuid) if i.start == 0)
    sim.run_process(uuid, 100, gpu_instance_id=busy.gpu_instance_id)
    reshaped: DesiredState = {**state, "generation": 2, "gpus": {uuid: desired(instances=[(5, 0)])}}
    reconcile.apply_desired_state(sim, reshaped, True)
    assert not reconcile.drifted(sim, reshaped)


# -- D2: MIG enabled and instances created in one desired state -----------------------------------


def hiding_a30() -> tuple[SimulatedBackend, str]:
    sim = SimulatedBackend(
        [specs.a30()], seed=1, quirks=DriverQuirks(hide_profiles_while_mig_off=True)
    )
    sim.init()
    return sim, sim.list_gpus()[0].uuid


def state(uuid: str, want: DesiredGpu, generation: int = 1) -> DesiredState:
    return {"type": "desired_state", "generation": generation, "gpus": {uuid: want}}


def test_instances_are_not_refused_against_the_empty_discovery_of_a_gpu_whose_mig_is_off():
    sim, uuid = hiding_a30()
    actions = plan(desired([(5, 0), (5, 2)]), observe(sim, None, uuid))
    assert not any(isinstance(a, reconcile.Invalid) for a in actions), actions
    assert [type(a) for a in actions] == [SetMigMode, Deferred, Deferred]


def test_enabling_mig_and_creating_instances_works_when_the_driver_hides_profiles_while_off():
    sim, uuid = hiding_a30()
    want = desired([(5, 0), (5, 2)])
    results = reconcile.apply_desired_state(sim, state(uuid, want), True)
    assert {(r["key"], r["status"]) for r in results} == {
        (f"{uuid}:mig_mode", "ok"),
        ("k5@0", "ok"),
        ("k5@2", "ok"),
    }
    assert [(i.profile_id, i.start) for i in sim.mig_instances(uuid)] == [(5, 0), (5, 2)]
    assert not reconcile.drifted(sim, state(uuid, want))


def test_a_placement_the_driver_refuses_once_mig_is_on_is_still_invalid():
    sim, uuid = hiding_a30()
    results = reconcile.apply_desired_state(sim, state(uuid, desired([(5, 1), (14, 0)])), True)
    by_key = {r["key"]: r for r in results}
    assert by_key["k5@1"]["status"] == "failed" and "placement" in by_key["k5@1"]["message"]
    assert by_key["k14@0"]["status"] == "ok"


# -- D3: Ampere toggles pending a reset -----------------------------------------------------------


def ampere() -> tuple[SimulatedBackend, str]:
    sim = SimulatedBackend([specs.a100()], seed=1, quirks=DriverQuirks.like_hardware())
    sim.init()
    return sim, sim.list_gpus()[0].uuid


def test_a_pending_toggle_says_needs_reset_and_what_holds_the_gpu():
    sim, uuid = ampere()
    results = reconcile.merge_results(
        apply(sim, plan(desired([(9, 0)]), observe(sim, None, uuid)), True)
    )
    mode = next(r for r in results if r["key"] == f"{uuid}:mig_mode")
    assert mode["status"] == "needs_reset" and "nvidia-persistenced" in mode["message"]
    assert {r["status"] for r in results} == {"needs_reset"}


def test_with_mutation_allowed_an_idle_ampere_gpu_is_reset_and_the_layout_applied():
    sim, uuid = ampere()
    want = desired([(9, 0), (9, 4)])
    results = reconcile.apply_desired_state(sim, state(uuid, want), True, resets=ResetLedger())
    by_key = {r["key"]: r for r in results}
    assert by_key[f"{uuid}:mig_mode"]["status"] == "ok"
    assert "reset" in by_key[f"{uuid}:mig_mode"]["message"]
    assert by_key["k9@0"]["status"] == by_key["k9@4"]["status"] == "ok"
    assert [(i.profile_id, i.start) for i in sim.mig_instances(uuid)] == [(9, 0), (9, 4)]


def test_a_failed_reset_is_reported_as_needs_reset_with_why(monkeypatch):
    sim, uuid = ampere()

    def refuse(gpu: str) -> None:
        raise BackendError("nvidia-smi -r: In use by another client")

    monkeypatch.setattr(sim, "reset_gpu", refuse)
    results = reconcile.apply_desired_state(
        sim, state(uuid, desired([(9, 0)])), True, resets=ResetLedger()
    )
    mode = next(r for r in results if r["key"] == f"{uuid}:mig_mode")
    assert mode["status"] == "needs_reset"
    assert (
        "nvidia-persistenced" in mode["message"] and "In use by another client" in mode["message"]
    )
    assert next(r for r in results if r["key"] == "k9@0")["status"] == "needs_reset"


def test_a_desired_state_sent_again_resets_the_gpu_at_most_once_per_generation(monkeypatch):
    sim, uuid = ampere()
    attempts: list[str] = []

    def refuse(gpu: str) -> None:
        attempts.append(gpu)
        raise BackendError("In use by another client")

    monkeypatch.setattr(sim, "reset_gpu", refuse)
    resets = ResetLedger()
    want = desired([(9, 0)])
    for _ in range(3):
        reconcile.apply_desired_state(sim, state(uuid, want, generation=7), True, resets=resets)
    assert attempts == [uuid]
    results = reconcile.apply_desired_state(sim, state(uuid, want, 7), True, resets=resets)
    mode = next(r for r in results if r["key"] == f"{uuid}:mig_mode")
    assert mode["status"] == "needs_reset" and "already tried" in mode["message"]
    reconcile.apply_desired_state(sim, state(uuid, want, generation=8), True, resets=resets)
    assert attempts == [uuid, uuid]
    # A mode waiting for a reset is not drift: applying again would change nothing.
    assert not reconcile.drifted(sim, state(uuid, want, 8))


def test_hopper_switches_without_a_reset(monkeypatch):
    sim = SimulatedBackend([specs.h100()], seed=1, quirks=DriverQuirks.like_hardware())
    uuid = sim.list_gpus()[0].uuid
    monkeypatch.setattr(sim, "reset_gpu", lambda gpu: pytest.fail("Hopper needs no reset"))
    results = reconcile.apply_desired_state(
        sim, state(uuid, desired([(9, 0)])), True, resets=ResetLedger()
    )
    assert {r["status"] for r in results} == {"ok"}


# -- D5, D15, D19: the MPS server, its clients, compute mode -------------------------------------


def mps_instance(want_instances, mps_on: bool) -> DesiredGpu:
    want = desired(want_instances)
    for inst in want["instances"]:
        inst["mps"] = {
            "enabled": mps_on,
            "per_instance": True,
            "default_active_thread_percentage": 50,
            "default_pinned_mem_limit_mib": None,
        }
    return want


def test_the_agents_idle_mps_server_does_not_block_removing_its_instance(tmp_path):
    sim = SimulatedBackend([specs.h100()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    converge(sim, uuid, mps_instance([(9, 0), (9, 4)], True), mps)
    gi = next(i for i in sim.mig_instances(uuid) if i.start == 0)
    client = sim.run_process(uuid, 100, gpu_instance_id=gi.gpu_instance_id)
    sim.kill_process(client)  # the job ended; its MPS server stays up until quit
    assert [p.kind for p in sim.processes(uuid)] == ["mps_server"]
    results = reconcile.merge_results(
        apply(sim, plan(desired([(9, 4)]), observe(sim, mps, uuid)), True, mps)
    )
    assert {r["status"] for r in results} == {"ok"}, results
    assert [(i.profile_id, i.start) for i in sim.mig_instances(uuid)] == [(9, 4)]
    assert sim.processes(uuid) == []


def test_mps_clients_block_the_destroy_and_the_quit_with_their_pids(tmp_path):
    sim = SimulatedBackend([specs.h100()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    converge(sim, uuid, mps_instance([(9, 0)], True), mps)
    gi = sim.mig_instances(uuid)[0]
    client = sim.run_process(uuid, 100, gpu_instance_id=gi.gpu_instance_id)
    results = reconcile.merge_results(
        apply(sim, plan(desired([(9, 4)]), observe(sim, mps, uuid)), True, mps)
    )
    by_key = {r["key"]: r for r in results}
    assert by_key[f"{uuid}:gi:9@0"]["status"] == "in_use"
    assert by_key[f"{uuid}:gi:9@0"]["pids"] == [client]
    assert by_key[f"{gi.uuid}:mps"]["status"] == "in_use"
    assert by_key[f"{gi.uuid}:mps"]["pids"] == [client]
    assert mps.healthy(gi.uuid)


def test_switching_an_mps_gpu_to_mig_stops_mps_first_and_restores_compute_mode(tmp_path):
    sim, uuid = sim_a30()
    mps = MpsManager(sim.mps_control, tmp_path)
    converge(sim, uuid, desired(mig=False, mps=True), mps)
    assert sim.compute_mode(uuid) == "exclusive_process"
    client = sim.run_process(uuid, 100)
    sim.kill_process(client)
    results, again = converge(sim, uuid, desired([(0, 0)]), mps)
    assert {r["status"] for r in results} == {"ok"}, results
    assert again == ()
    assert sim.list_gpus()[0].mig_mode_current is True
    assert mps.managed_targets() == []


def test_whole_gpu_mps_runs_in_exclusive_process_mode_and_leaves_default(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    converge(sim, uuid, desired(mig=False, mps=True), mps)
    assert sim.compute_mode(uuid) == "exclusive_process"
    converge(sim, uuid, desired(mig=False), mps)
    assert sim.compute_mode(uuid) == "default"


def test_simulated_allocations_on_an_mps_gpu_run_as_mps_clients(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    want = desired(mig=False, mps=True)
    want["allocations"] = [
        {
            "key": "a1",
            "gpu_uuid": uuid,
            "partition_key": None,
            "memory_mib": 2048,
            "max_compute_percent": 25,
        }
    ]
    results = reconcile.apply_desired_state(sim, state(uuid, want), True, mps)
    assert {r["status"] for r in results} == {"ok"}
    assert sorted(p.kind for p in sim.processes(uuid)) == ["mps_client", "mps_server"]


# -- M2: the daemon holds the shares' limits, which a client's environment cannot raise ----------

RAISED = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}


def share(key: str, uuid: str, memory_mib: int, percent: int | None, partition_key=None):
    return {
        "key": key,
        "gpu_uuid": uuid,
        "partition_key": partition_key,
        "memory_mib": memory_mib,
        "max_compute_percent": percent,
    }


def test_a_lone_shares_limits_are_the_daemons_so_a_client_cannot_raise_them(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    want = desired(mig=False, mps=True, allocations=[share("a1", uuid, 2048, 25)])
    results = reconcile.apply_desired_state(sim, state(uuid, want), True, mps)
    assert {r["status"] for r in results} == {"ok"}, results
    assert mps.limits(uuid) == MpsLimits(25, 2048)
    assert sim.mps_limits(sim.process_keys(uuid)["a1"]) == MpsLimits(25, 2048)
    assert sim.mps_limits(sim.run_process(uuid, 100, env=RAISED)) == MpsLimits(25, 2048)
    assert plan(want, observe(sim, mps, uuid)) == ()


def test_unequal_shares_on_one_daemon_get_the_largest_and_the_ack_says_so(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    shares = [share("small", uuid, 1024, 10), share("large", uuid, 4096, 40)]
    want = desired(mig=False, mps=True, allocations=shares)
    results = reconcile.apply_desired_state(sim, state(uuid, want), True, mps)
    [item] = [r for r in results if r["key"] == f"{uuid}:mps"]
    assert item["status"] == "ok" and "1 of 2 MPS share(s)" in item["message"], item
    assert mps.limits(uuid) == MpsLimits(40, 4096)
    assert sim.mps_limits(sim.run_process(uuid, 100, env=RAISED)) == MpsLimits(40, 4096)


def test_when_the_larger_share_leaves_its_neighbours_server_is_lowered_for_new_clients(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    small, large = share("small", uuid, 1024, 10), share("large", uuid, 4096, 40)
    reconcile.apply_desired_state(
        sim, state(uuid, desired(mig=False, mps=True, allocations=[small, large])), True, mps
    )
    left = desired(mig=False, mps=True, allocations=[small])
    results = reconcile.apply_desired_state(sim, state(uuid, left, 2), True, mps)
    assert {r["status"] for r in results} == {"ok"}, results
    daemon = mps.daemon(uuid)
    server = sim.mps_control.command(daemon, "get_server_list")
    assert sim.mps_control.command(daemon, f"get_active_thread_percentage {server}") == "10.0"
    assert sim.mps_limits(sim.run_process(uuid, 100, env=RAISED)) == MpsLimits(10, 1024)


def test_a_share_in_a_mig_instance_is_held_by_that_instances_daemon(tmp_path):
    sim = SimulatedBackend([specs.h100()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    want = mps_instance([(9, 0)], True)
    want["allocations"] = [share("a1", uuid, 3072, 30, partition_key="k9@0")]
    results = reconcile.apply_desired_state(sim, state(uuid, want), True, mps)
    assert {r["status"] for r in results} == {"ok"}, results
    [gi] = sim.mig_instances(uuid)
    assert mps.limits(gi.uuid or "") == MpsLimits(30, 3072)
    client = sim.run_process(uuid, 100, gpu_instance_id=gi.gpu_instance_id, env=RAISED)
    assert sim.mps_limits(client) == MpsLimits(30, 3072)


# -- D9, D10: limits on a running daemon, daemons after an agent restart -------------------------


def test_a_limit_change_reaches_the_running_server_and_is_read_back(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    mps = MpsManager(sim.mps_control, tmp_path)
    converge(sim, uuid, desired(mig=False, mps=True), mps)
    sim.run_process(uuid, 100)  # a client keeps the server up
    want = desired(mig=False, mps=True)
    want["mps"]["default_active_thread_percentage"] = 25
    results, again = converge(sim, uuid, want, mps)
    [item] = reconcile.merge_results(results)
    assert item["status"] == "ok" and "connected client" in item["message"]
    assert again == ()
    daemon = mps.daemon(uuid)
    server = sim.mps_control.command(daemon, "get_server_list")
    assert sim.mps_control.command(daemon, f"get_active_thread_percentage {server}") == "25.0"
    assert mps.info(uuid)["default_active_thread_percentage"] == 25


def test_after_an_agent_restart_unwanted_mps_daemons_are_adopted_and_stopped(tmp_path):
    sim = SimulatedBackend([specs.l4()], seed=1)
    uuid = sim.list_gpus()[0].uuid
    converge(sim, uuid, desired(mig=False, mps=True), MpsManager(sim.mps_control, tmp_path))
    restarted = MpsManager(sim.mps_control, tmp_path)  # a new agent process, same daemons
    results, again = converge(sim, uuid, desired(mig=False), restarted)
    assert [(r["key"], r["status"]) for r in results] == [(f"{uuid}:mps", "ok")]
    assert again == ()
    assert sim.mps_control.running_targets(tmp_path) == []
