"""Host-only placement: the host where taking only a demand's CPU and memory fragments least, for
the fleet's request mix (:mod:`fleet.placement.fragment`), scored as the product strategy
(:mod:`fleet.placement.mixfit`) scores a host. The product places no such request; the trace
benchmark places its CPU-only pods with it.
"""

from __future__ import annotations

from fleet.placement import rules
from fleet.placement.fragment import Fragmentation, HostKey, scorer_for
from fleet.placement.mix import RequestMix
from fleet.placement.mixfit import demand_key, host_state
from fleet.placement.signature import intern
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    HostGroup,
    HostState,
)


def rank_host_only(
    snapshot: FleetSnapshot, demand: Demand, mix: RequestMix | None
) -> HostState | None:
    """The host where taking only ``demand``'s CPU and memory fragments least; ``None`` when no
    host has room. Ties go to the first in the snapshot's order (the host groups' order, or the
    hosts' when some host has no GPU). The product places no such request; the trace benchmark
    places its CPU-only pods with it."""
    scorer = scorer_for(mix)
    slot = scorer.slot_of(("host", demand_key(demand)))
    groups: list[HostGroup | None] = list(snapshot.host_groups)
    hosts = [g.host for g in snapshot.host_groups]
    if len(groups) != len(snapshot.hosts) or any(h is None for h in hosts):
        hosts = list(snapshot.hosts)
        groups = [snapshot.group(h.id) for h in snapshot.hosts]
    best: tuple[int, HostState] | None = None
    for host, group in zip(hosts, groups, strict=True):
        if host is None or rules.avoided(host, demand):
            continue
        memo = group.memo if group is not None else {}
        score = memo.get(slot)
        if score is None:
            score = memo[slot] = _host_only_score(scorer, host, group, demand)
        if score >= 0 and (best is None or score > best[0]):
            best = (score, host)
    return None if best is None else best[1]


def _host_only_score(
    scorer: Fragmentation, host: HostState, group: HostGroup | None, demand: Demand
) -> int:
    if not rules.host_takes(host, demand):
        return -1
    if group is None:
        key: HostKey = (host.cpu_free_milli, host.memory_free_mib, ())
        state = (intern(key), key)
    else:
        state = host_state(scorer, group)
    return scorer.delta_score(state, (), (), demand.cpu_milli, demand.host_memory_mib)
