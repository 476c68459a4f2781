from __future__ import annotations

import pytest

from fleet.mps import MpsRequest
from fleet.placement.fragment import scorer_for
from fleet.placement.mix import (
    NEUTRAL_MIX,
    MixLearner,
    RequestMix,
    RequestShape,
    profile_name,
    shape_of,
)
from fleet.placement.snapshot import Demand, MigRequest, WholeGpuRequest

MPS_4G = RequestShape("mps", memory_mib=4000)


def test_shapes_name_what_fragmentation_looks_at() -> None:
    assert shape_of(MpsRequest(4000)) == MPS_4G
    assert shape_of(MpsRequest(4000, 30)) == RequestShape(
        "mps", memory_mib=4000, compute_percent=30
    )
    assert shape_of(MigRequest("MIG-3g.40gb")) == RequestShape("mig", profile="3g.40gb")
    assert shape_of(WholeGpuRequest(4)) == RequestShape("gpu", gpu_count=4)
    assert shape_of(None, Demand(2000, 4096, ("T4", "A10"))) == RequestShape(
        "host", cpu_milli=2000, host_memory_mib=4096, products=("A10", "T4")
    )


def test_profile_names_are_spelled_one_way() -> None:
    assert profile_name("MIG-1g.10gb") == profile_name(" 1g.10GB ") == "1g.10gb"


def test_a_mix_keeps_the_most_frequent_shapes_up_to_the_coverage_and_renormalises() -> None:
    rare = RequestShape("gpu", gpu_count=8)
    counts = {MPS_4G: 60.0, RequestShape("gpu", gpu_count=1): 37.0, rare: 3.0}

    mix = RequestMix.from_counts(counts, coverage=0.95)

    assert mix.shapes == (MPS_4G, RequestShape("gpu", gpu_count=1))
    assert mix.weights == pytest.approx((60 / 97, 37 / 97))


def test_deployments_weigh_by_their_replicas() -> None:
    mix = RequestMix.of([(MpsRequest(4000), 3.0), (WholeGpuRequest(1), 1.0)])

    assert dict(zip(mix.shapes, mix.weights, strict=True)) == {
        MPS_4G: 0.75,
        RequestShape("gpu", gpu_count=1): 0.25,
    }


def test_no_requests_make_an_empty_mix_and_the_strategy_falls_back_to_the_neutral_one() -> None:
    empty = RequestMix.from_counts({})

    assert empty.shapes == ()
    assert scorer_for(empty).mix == NEUTRAL_MIX
    assert scorer_for(None).mix == NEUTRAL_MIX


def test_equal_mixes_share_one_compiled_scorer() -> None:
    a = RequestMix((MPS_4G,), (1.0,))
    b = RequestMix((MPS_4G,), (1.0,))

    assert scorer_for(a) is scorer_for(b)


def test_a_mix_needs_one_weight_per_shape() -> None:
    with pytest.raises(ValueError, match="one weight per shape"):
        RequestMix((MPS_4G,), ())


def test_the_learner_refreshes_its_mix_after_1_2_4_8_requests() -> None:
    learner = MixLearner()
    mixes = []
    for _ in range(9):
        learner.observe(MPS_4G)
        mixes.append(learner.mix)

    assert learner.seen == 9
    refreshed = [k + 1 for k in range(9) if k == 0 or mixes[k] is not mixes[k - 1]]
    assert refreshed == [1, 2, 4, 8]
    assert mixes[-1] == RequestMix((MPS_4G,), (1.0,))
