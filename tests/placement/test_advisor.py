from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.mig import Instance, product_by_key, valid_layouts, validate_layout
from fleet.placement import advisor
from fleet.placement.advisor import (
    AdvisorGpu,
    ExistingInstance,
    WaitingMig,
    WaitingMps,
    advise,
    mps_instance_capacity,
)

H100 = product_by_key("h100-sxm5-80gb")
assert H100 is not None
P7 = H100.profile("7g.80gb").id
P4 = H100.profile("4g.40gb").id
P3 = H100.profile("3g.40gb").id
P1 = H100.profile("1g.10gb").id
LAYOUTS = valid_layouts(H100)


def layout_of(gpu_advice):
    return [Instance(i.profile_id, i.start) for i in gpu_advice.instances]


def test_an_empty_gpu_takes_a_waiting_replica_without_moving_anything():
    gpus = [AdvisorGpu(1, H100, (ExistingInstance(P1, 0, replicas=1),)), AdvisorGpu(2, H100)]
    advice = advise(gpus, [WaitingMig("big", P7, 1)])
    assert advice.placed == {"big": 1}
    assert advice.moved_replicas == 0
    assert advice.status == "optimal" and advice.gap_percent == 0.0
    first, second = advice.gpus
    assert not first.changed
    assert [(i.profile_id, i.start, i.serves) for i in second.instances] == [(P7, 0, "big")]


def test_running_instances_stay_and_new_ones_fit_around_them():
    gpus = [AdvisorGpu(1, H100, (ExistingInstance(P3, 4, replicas=1),))]
    advice = advise(gpus, [WaitingMig("four", P4, 1)])
    assert advice.placed == {"four": 1}
    assert {(i.profile_id, i.start) for i in advice.gpus[0].instances} == {(P3, 4), (P4, 0)}
    assert not advice.gpus[0].drained


def test_a_replica_moves_only_when_that_places_more():
    gpus = [
        AdvisorGpu(1, H100, (ExistingInstance(P1, 6, replicas=1),)),
        AdvisorGpu(2, H100, (ExistingInstance(P1, 0, replicas=1),)),
    ]
    advice = advise(gpus, [WaitingMig("big", P7, 1)])
    assert advice.placed == {"big": 1}
    assert advice.moved_replicas == 1
    drained = [g for g in advice.gpus if g.drained]
    assert len(drained) == 1 and drained[0].moved_replicas == 1
    receivers = [i for g in advice.gpus for i in g.instances if i.serves == "moved"]
    assert [(i.profile_id, i.replicas) for i in receivers] == [(P1, 1)]


def test_idle_instances_are_reused_before_new_ones_are_made():
    gpus = [AdvisorGpu(1, H100, (ExistingInstance(P3, 0), ExistingInstance(P3, 4)))]
    advice = advise(gpus, [WaitingMig("three", P3, 1)])
    assert advice.placed == {"three": 1}
    assert not advice.gpus[0].changed


def test_mps_replicas_run_in_new_instances_that_run_mps():
    advice = advise([AdvisorGpu(1, H100)], [], [WaitingMps("small", 9000, 5)])
    assert advice.placed == {"small": 5}
    served = [i for i in advice.gpus[0].instances if i.serves == "small"]
    assert served and all(i.mps for i in served)
    assert sum(i.replicas for i in served) == 5
    for i in served:
        profile = H100.profile(i.profile_id)
        assert i.replicas <= mps_instance_capacity(H100, profile, 9000)


def test_without_ortools_the_greedy_plan_is_the_answer(monkeypatch):
    monkeypatch.setattr(advisor, "load_cp_model", lambda: None)
    advice = advise([AdvisorGpu(1, H100)], [WaitingMig("big", P7, 2)])
    assert advice.status == "heuristic"
    assert advice.placed == {"big": 1}


def test_nothing_waiting_is_trivial():
    advice = advise([AdvisorGpu(1, H100)], [])
    assert advice.status == "trivial" and advice.placed == {}


@st.composite
def fleets(draw):
    gpus = []
    for gpu_id in range(draw(st.integers(1, 4))):
        layout = draw(st.sampled_from(LAYOUTS))
        instances = tuple(
            ExistingInstance(i.profile_id, i.start, draw(st.integers(0, 2)), draw(st.booleans()))
            for i in layout
        )
        gpus.append(AdvisorGpu(gpu_id, H100, instances))
    profiles = [p.id for p in H100.profiles]
    mig = [
        WaitingMig(f"d{k}", draw(st.sampled_from(profiles)), draw(st.integers(1, 3)))
        for k in range(draw(st.integers(0, 3)))
    ]
    mps = [
        WaitingMps(f"m{k}", draw(st.integers(1000, 40000)), draw(st.integers(1, 6)))
        for k in range(draw(st.integers(0, 2)))
    ]
    return gpus, mig, mps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_advised_layouts_are_valid_and_destroy_no_running_instance_unless_moved(case):
    gpus, mig, mps = case
    result = advise(gpus, mig, mps, time_limit_s=2.0)
    assert [g.gpu_id for g in result.gpus] == [g.id for g in gpus]
    for gpu, proposed in zip(gpus, result.gpus, strict=True):
        assert validate_layout(H100, layout_of(proposed)) == ()
        kept = {(i.profile_id, i.start) for i in proposed.instances}
        running = [i for i in gpu.instances if i.replicas]
        if not proposed.drained:
            assert all((i.profile_id, i.start) in kept for i in running)
            assert proposed.moved_replicas == 0
        else:
            assert proposed.moved_replicas == sum(i.replicas for i in running) > 0
    assert result.moved_replicas == sum(g.moved_replicas for g in result.gpus)
    for key, count in result.placed.items():
        assert count <= result.waiting[key]
    assert result.objective <= result.bound
    if result.status == "optimal":
        assert result.objective == result.bound


@pytest.mark.parametrize("trace_profiles", [[P7, P4, P3, P1, P1]])
def test_the_solver_is_optimal_on_a_small_cold_fleet(trace_profiles):
    waiting = [WaitingMig(str(p), p, trace_profiles.count(p)) for p in set(trace_profiles)]
    result = advise([AdvisorGpu(k, H100) for k in range(2)], waiting)
    assert result.status == "optimal"
    assert result.placed_total == 4  # 7g; then 4g with both 1g beat 4g + 3g (one replica more)
