"""Our default trace policy: fragmentation-aware placement that learns the workload online.

It extends FGD in three ways, each aimed at where FGD leaves GPUs idle at 130 % load:

* the mix is learned from the arrivals so far (no knowledge of the future), refreshed as it grows;
* memory counts: a type whose memory the node lacks finds none of its GPUs usable;
* a stranding term charges the free GPU milli that the node's CPU and memory left cannot feed at
  the mix's average CPU and memory per GPU, so CPU-heavy pods avoid GPU-dense nodes.

Ties keep the published rule (best integer score, then the fixed per-seed node order).
"""

from __future__ import annotations

from collections import Counter

from fleet.placement.benchmarks.frag import Fragmentation, Mix, PodType, mix_from_counts, pod_type
from fleet.placement.benchmarks.policies import Fgd
from fleet.placement.benchmarks.trace import TracePod

DEFAULT_STRAND_WEIGHT = 1.0


class FragmentationAware(Fgd):
    """FGD with an online mix, memory and a CPU/memory stranding term.

    Args:
        mix: a fixed mix (marks the policy as using the trace mix); ``None`` learns online.
        strand_weight: weight of the stranding term against FGD's fragmentation.

    The learned mix is refreshed after 1, 2, 4, 8, … arrivals: the trace's mix is stationary, so
    the estimate settles early, and the rare refreshes keep the memoised scores warm (p99).
    """

    name = "fgd+"

    def __init__(
        self,
        mix: Mix | None = None,
        *,
        strand_weight: float = DEFAULT_STRAND_WEIGHT,
        count_memory: bool = True,
    ) -> None:
        super().__init__(mix or Mix((), ()), uses_trace_mix=mix is not None)
        self.strand_weight = strand_weight
        self.count_memory = count_memory
        self._counts: Counter[PodType] = Counter()
        self._seen = 0
        self._next_refresh = 1
        self._rebuild(self.frag.mix)

    def _rebuild(self, mix: Mix) -> None:
        self.frag = Fragmentation(
            mix, count_memory=self.count_memory, strand_weight=self.strand_weight
        )
        self._reset()

    def observe(self, pod: TracePod) -> None:
        """Count the arrival; refresh the learned mix after 1, 2, 4, 8, … arrivals."""
        if self.uses_trace_mix:
            return
        self._counts[pod_type(pod, with_memory=self.count_memory)] += 1
        self._seen += 1
        if self._seen >= self._next_refresh:
            self._rebuild(mix_from_counts(self._counts))
            self._next_refresh = self._seen * 2
