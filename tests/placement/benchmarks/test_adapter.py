"""The trace benchmark's adapter: the trace's nodes as the product's snapshot, pods as requests,
and the product engine replaying a tiny trace through ``rank``."""

from __future__ import annotations

from fleet.mps import MpsRequest
from fleet.placement.benchmarks.adapter import (
    GPU_MEMORY_MIB,
    TraceFleet,
    trace_demand,
    trace_request,
)
from fleet.placement.benchmarks.bench import make_policy
from fleet.placement.benchmarks.cluster import Cluster, Placement
from fleet.placement.benchmarks.replay import replay
from fleet.placement.benchmarks.trace import TraceNode, TracePod
from fleet.placement.snapshot import Demand, WholeGpuRequest

NODES = (TraceNode("a", 16000, 65536, 2, "T4"), TraceNode("b", 64000, 262144, 4, "V100M32"))


def test_pods_become_the_products_requests() -> None:
    share = TracePod("s", 4000, 8192, 1, 250, ("T4",))

    assert trace_request(share) == MpsRequest(250 * GPU_MEMORY_MIB // 1000, 25)
    assert trace_request(TracePod("w", 8000, 8192, 2, 1000)) == WholeGpuRequest(2)
    assert trace_request(TracePod("c", 2000, 1024, 0, 0)) is None
    assert trace_demand(share) == Demand(4000, 8192, ("T4",))


def test_the_fleet_lists_hosts_in_the_tie_order_and_idle_gpus_in_the_mode_asked_for() -> None:
    fleet = TraceFleet(NODES, order=[1, 0])

    mps = fleet.snapshot_for(MpsRequest(1000))
    whole = fleet.snapshot_for(WholeGpuRequest(1))

    assert [h.id for h in mps.hosts] == [1, 0]
    assert [g.id for g in mps.gpus] == [2, 3, 4, 5, 0, 1]
    assert {g.mode for g in mps.gpus} == {"mps"} and {g.mode for g in whole.gpus} == {"dedicated"}
    assert (mps.hosts[0].cpu_free_milli, mps.hosts[0].memory_free_mib) == (64000, 262144)


def test_a_placement_takes_host_and_gpu_capacity_in_both_views() -> None:
    fleet = TraceFleet(NODES)

    fleet.place(0, Demand(4000, 1024), MpsRequest(8000), (1,))

    for snapshot in (fleet.snapshot_for(MpsRequest(1)), fleet.snapshot_for(WholeGpuRequest(1))):
        host, gpu = snapshot.host(0), snapshot.gpu(1)
        assert host is not None and gpu is not None
        assert (host.cpu_free_milli, host.memory_free_mib) == (12000, 64512)
        assert (gpu.mode, gpu.mps_reservations) == ("mps", (MpsRequest(8000),))


class Recorded:
    """Records the placements of a policy."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.uses_trace_mix = inner.uses_trace_mix
        self.placements: list[Placement | None] = []

    def observe(self, pod: TracePod) -> None:
        self.inner.observe(pod)

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        placement = self.inner.choose(cluster, pod)
        self.placements.append(placement)
        return placement


def test_a_tiny_trace_replays_through_rank_to_the_expected_allocation() -> None:
    nodes = (TraceNode("a", 32000, 65536, 2, "T4"), TraceNode("b", 32000, 65536, 2, "T4"))
    pods = (
        TracePod("s1", 1000, 1024, 1, 500),  # a share opens GPU 0 of node a
        TracePod("s2", 1000, 1024, 1, 500),  # the next fills it: no fragment left
        TracePod("w2", 1000, 1024, 2, 1000),  # two whole GPUs: only node b has them
        TracePod("c", 1000, 1024, 0, 0),  # CPU only: strands nothing anywhere, so the first node
        TracePod("s3", 1000, 1024, 1, 300),  # a share: node a's last GPU
        TracePod("big", 1000, 1024, 1, 800),  # no GPU has 800 left: failed
    )
    policy = Recorded(make_policy("product", pods, 0, nodes, [0, 1]))

    result = replay(nodes, pods, policy, order=[0, 1])

    assert policy.placements == [
        Placement(0, (0,)),
        Placement(0, (0,)),
        Placement(1, (0, 1)),
        Placement(0, ()),
        Placement(0, (1,)),
        None,
    ]
    assert (result.placed_pods, result.failed_pods) == (5, 1)


def test_a_cpu_only_pod_keeps_off_the_node_whose_gpus_it_would_strand() -> None:
    nodes = (TraceNode("busy", 32000, 65536, 2, "T4"), TraceNode("lean", 2000, 65536, 2, "T4"))
    pods = (
        TracePod("w2", 1000, 1024, 2, 1000),  # takes node busy's GPUs (first in the order)
        TracePod("c", 1500, 1024, 0, 0),  # on node lean it would leave 500 milli-CPU
    )
    policy = Recorded(make_policy("product", pods, 0, nodes, [0, 1]))

    replay(nodes, pods, policy, order=[0, 1])

    assert policy.placements == [Placement(0, (0, 1)), Placement(0, ())]
