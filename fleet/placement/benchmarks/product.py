"""The product engine as a trace-replay policy: every decision is :func:`fleet.placement.rank`
with the ``product`` strategy on the trace's :class:`TraceFleet` snapshot, the call the API and
auto-placement make, with a mix learned online from the arrivals so far.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.placement.benchmarks.adapter import TraceFleet, trace_demand, trace_request
from fleet.placement.benchmarks.cluster import Cluster, Placement
from fleet.placement.benchmarks.trace import TraceNode, TracePod
from fleet.placement.fit import rank
from fleet.placement.hostfit import rank_host_only
from fleet.placement.mix import MixLearner, shape_of


class ProductPolicy:
    """``rank(snapshot, request, strategy="product", mix=..., demand=...)`` per pod.

    The replay applies every placement this policy returns, so the policy applies it to its own
    snapshot as it answers; the replay's :class:`Cluster` checks it independently.
    """

    name = "product"
    uses_trace_mix = False

    def __init__(self, nodes: Sequence[TraceNode], order: Sequence[int] | None = None) -> None:
        self.fleet = TraceFleet(nodes, order)
        self.learner = MixLearner()

    def observe(self, pod: TracePod) -> None:
        """Count the arrival in the mix (the fleet has seen this request)."""
        self.learner.observe(shape_of(trace_request(pod), trace_demand(pod)))

    def choose(self, cluster: Cluster, pod: TracePod) -> Placement | None:
        """Rank the pod's request on the snapshot; apply and return the best target."""
        request = trace_request(pod)
        demand = trace_demand(pod)
        snapshot = self.fleet.snapshot_for(request)
        mix = self.learner.mix
        if request is None:
            host = rank_host_only(snapshot, demand, mix)
            if host is None:
                return None
            self.fleet.place(host.id, demand, None, ())
            return Placement(host.id, ())
        best = rank(snapshot, request, strategy="product", mix=mix, demand=demand).best
        if best is None:
            return None
        node, _ = self.fleet.local(best.gpu_ids[0])
        self.fleet.place(node, demand, request, best.gpu_ids)
        return Placement(node, tuple(self.fleet.local(g)[1] for g in best.gpu_ids))
