from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.placement.benchmarks.bench import POLICIES, make_policy
from fleet.placement.benchmarks.cluster import CapacityError, Cluster, Placement
from fleet.placement.benchmarks.policies import Policy
from fleet.placement.benchmarks.replay import replay, tie_order
from fleet.placement.benchmarks.trace import MILLI, TraceNode, TracePod, arrival_order
from tests.placement.benchmarks.strategies import nodes, pods


class Audited:
    """Wraps a policy and checks every decision against an independent fit check."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.uses_trace_mix = inner.uses_trace_mix

    def observe(self, pod: TracePod) -> None:
        self.inner.observe(pod)

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        placement = self.inner.choose(cluster, pod)
        fits_somewhere = any(cluster.fits(i, pod) for i in range(len(cluster.nodes)))
        assert (placement is not None) == fits_somewhere, "refused placeable work or placed misfit"
        if placement is not None:
            assert cluster.fits(placement.node, pod)
            for g in placement.gpus:
                assert cluster.gpus[placement.node][g] >= pod.gpu_milli
        return placement


@settings(max_examples=40, deadline=None)
@given(
    cluster_nodes=nodes(),
    arrivals=pods(),
    policy=st.sampled_from(POLICIES),
    seed=st.integers(0, 99),
)
def test_policies_place_exactly_what_fits_and_never_exceed_capacity(
    cluster_nodes: tuple[TraceNode, ...], arrivals: tuple[TracePod, ...], policy: str, seed: int
) -> None:
    order = tie_order(len(cluster_nodes), seed)
    audited = Audited(make_policy(policy, arrivals, seed, cluster_nodes, order))
    result = replay(cluster_nodes, arrivals, audited, order=order)

    assert result.placed_pods + result.failed_pods == len(arrivals)
    assert all(0.0 <= a <= 100.0 for a in result.alloc_ratio)


@settings(max_examples=25, deadline=None)
@given(
    cluster_nodes=nodes(),
    arrivals=pods(),
    policy=st.sampled_from(POLICIES),
    seed=st.integers(0, 99),
)
def test_replay_is_deterministic_for_a_seed(
    cluster_nodes: tuple[TraceNode, ...], arrivals: tuple[TracePod, ...], policy: str, seed: int
) -> None:
    def run() -> tuple[tuple[float, ...], int]:
        order = tie_order(len(cluster_nodes), seed)
        policy_obj = make_policy(policy, arrivals, seed, cluster_nodes, order)
        result = replay(cluster_nodes, arrivals, policy_obj, order=order)
        return result.alloc_ratio, result.failed_pods

    assert run() == run()


def test_cluster_refuses_a_placement_that_does_not_fit() -> None:
    cluster = Cluster([TraceNode("n", 4000, 1024, 1, "A")])
    pod = TracePod("p", 1000, 512, 1, 600)
    cluster.place(pod, Placement(0, (0,)))

    with pytest.raises(CapacityError):
        cluster.place(pod, Placement(0, (0,)))
    assert cluster.gpus[0] == [400]


def test_cluster_gives_back_what_a_removed_pod_took() -> None:
    cluster = Cluster([TraceNode("n", 4000, 1024, 2, "A")])
    pod = TracePod("p", 1000, 512, 2, 1000)
    cluster.place(pod, Placement(0, (0, 1)))
    cluster.remove(pod, Placement(0, (0, 1)))

    assert (cluster.cpu_left[0], cluster.mem_left[0], cluster.gpus[0]) == (
        4000,
        1024,
        [MILLI, MILLI],
    )


def test_gpu_spec_keeps_a_pod_off_other_models() -> None:
    cluster = Cluster([TraceNode("a", 4000, 1024, 1, "A"), TraceNode("b", 4000, 1024, 1, "B")])

    assert list(cluster.candidates(TracePod("p", 1000, 512, 1, 500, ("B",)))) == [1]


def test_arrivals_are_inflated_to_just_under_130_percent() -> None:
    pool = tuple(TracePod(f"p{i}", 1000, 1, 1, m) for i, m in enumerate([300, 700, 1000, 500]))
    capacity = 10 * MILLI

    arrivals = arrival_order(pool, capacity, seed=7)

    total = sum(p.gpu_request_milli for p in arrivals)
    assert total <= 1.3 * capacity
    assert sorted(p.name for p in arrivals[: len(pool)]) == sorted(p.name for p in pool)
    assert arrival_order(pool, capacity, seed=7) == arrivals


def test_a_trace_above_the_target_loses_random_pods() -> None:
    pool = tuple(TracePod(f"p{i}", 1000, 1, 1, 1000) for i in range(20))

    arrivals = arrival_order(pool, 10 * MILLI, seed=1)

    assert len(arrivals) == 13


def test_the_tie_order_is_a_permutation_fixed_per_seed() -> None:
    order = tie_order(50, 42)

    assert sorted(order) == list(range(50))
    assert order == tie_order(50, 42) != tie_order(50, 43)


def test_fgd_prefers_the_gpu_that_leaves_no_fragment() -> None:
    node = [TraceNode("n", 64000, 65536, 2, "A")]
    filler = TracePod("f", 1000, 512, 1, 500)
    pod = TracePod("p", 1000, 512, 1, 500)
    policy = make_policy("fgd", [pod] * 9 + [TracePod("w", 1000, 512, 1, 1000)], 0)
    cluster = Cluster(node)
    cluster.place(filler, Placement(0, (1,)))

    assert policy.choose(cluster, pod) == Placement(0, (1,))


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_fails_a_pod_that_fits_nowhere(policy: str) -> None:
    cluster = Cluster([TraceNode("n", 4000, 1024, 1, "A")])
    too_big = TracePod("p", 8000, 512, 1, 500)

    policy_obj = make_policy(policy, [too_big], 0, cluster.nodes)
    assert policy_obj.choose(cluster, too_big) is None


def test_all_policy_names_build() -> None:
    for name, seed in itertools.product(POLICIES, [1]):
        assert make_policy(name, (), seed).name == name
