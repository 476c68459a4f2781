from __future__ import annotations

import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.mig import UnknownProfileError, validate_layout
from fleet.placement.benchmarks.migbench import resolve_product
from fleet.placement.benchmarks.repack import RepackResult, lower_bound, repack

H100 = resolve_product("h100-sxm5-80gb")
# FFD opens four GPUs; the combinatorial bound says three; CP-SAT proves four is the optimum.
HARD = [5, 9, 9, 9, 9, 15, 20, 20]


def assert_valid_packing(requests: list[int], result: RepackResult) -> None:
    assert result.gpus_used == len(result.bins)
    assert all(validate_layout(H100, layout) == () for layout in result.bins)
    assert len(result.assignment) == len(requests)
    for index, layout in enumerate(result.bins):
        given_here = Counter(requests[k] for k, b in enumerate(result.assignment) if b == index)
        assert given_here == Counter(i.profile_id for i in layout)
    assert result.lower_bound <= result.gpus_used
    assert result.optimal == (result.lower_bound == result.gpus_used)


@pytest.fixture
def without_ortools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)


def test_two_3g_and_a_1g_take_two_gpus() -> None:
    result = repack([9, 9, 19], H100)

    assert (result.gpus_used, result.lower_bound, result.optimal) == (2, 2, True)


def test_nothing_to_pack_takes_no_gpu() -> None:
    assert repack([], H100) == RepackResult((), 0, 0, True, "heuristic", ())


def test_names_are_accepted_and_unknown_profiles_refused() -> None:
    assert repack(["mig-3g.40gb", "4g.40gb"], H100).gpus_used == 1
    with pytest.raises(UnknownProfileError):
        repack(["9g.99gb"], H100)


def test_cp_sat_proves_the_optimum_the_simple_bounds_miss() -> None:
    pytest.importorskip("ortools")
    assert lower_bound(H100, [p for p in (H100.profile(i) for i in HARD) if p]) == 3

    result = repack(HARD, H100, time_limit_s=10)

    assert (result.solver, result.optimal, result.gpus_used, result.lower_bound) == (
        "cp-sat",
        True,
        4,
        4,
    )
    assert_valid_packing(HARD, result)


def test_cp_sat_beats_first_fit_decreasing_where_it_can() -> None:
    pytest.importorskip("ortools")
    requests = [5, 9, 14, 15, 19, 19, 20, 20]  # FFD opens three GPUs

    result = repack(requests, H100, time_limit_s=10)

    assert (result.solver, result.gpus_used, result.optimal) == ("cp-sat", 2, True)
    assert_valid_packing(requests, result)


@pytest.mark.usefixtures("without_ortools")
def test_without_ortools_the_heuristic_answers_with_the_simple_bound() -> None:
    result = repack(HARD, H100)

    assert (result.solver, result.gpus_used, result.lower_bound, result.optimal) == (
        "heuristic",
        4,
        3,
        False,
    )
    assert_valid_packing(HARD, result)


requests_strategy = st.lists(st.sampled_from([0, 5, 9, 14, 15, 19, 20]), max_size=24)


@settings(max_examples=30, deadline=None)
@given(requests=requests_strategy)
def test_every_repack_places_every_request_on_valid_layouts_above_the_bound(
    requests: list[int],
) -> None:
    result = repack(requests, H100, time_limit_s=5)

    assert_valid_packing(requests, result)
    assert repack(requests, H100, time_limit_s=5).gpus_used == result.gpus_used


@settings(max_examples=30, deadline=None)
@given(requests=requests_strategy)
def test_the_heuristic_fallback_is_valid_too(requests: list[int]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "ortools.sat.python.cp_model", None)
        result = repack(requests, H100)

    assert result.solver == "heuristic"
    assert_valid_packing(requests, result)


def test_thousands_of_requests_solve_fast() -> None:
    pytest.importorskip("ortools")
    requests = [0] * 500 + [5] * 300 + [9] * 250 + [14] * 200 + [19] * 50 + [15] * 40

    result = repack(requests, H100, time_limit_s=20)

    assert result.optimal
    assert_valid_packing(requests, result)


def test_a_solver_without_time_still_returns_a_valid_packing() -> None:
    result = repack(HARD, H100, time_limit_s=1e-6)

    assert_valid_packing(HARD, result)
