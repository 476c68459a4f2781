"""The product strategy: targets ranked by how little they fragment their host for the fleet's
request mix (:mod:`fleet.placement.fragment`), FGD's integer score, ties in snapshot order.

The rules that decide what fits are :mod:`fleet.placement.rules`, shared with every strategy. One
pass over the host groups finds the best target; the full lists of a :class:`Ranking` are built
only when read. Per-GPU options and per-host results are memoised on the frozen states they are
computed from, so a caller that applies one placement at a time
(:meth:`FleetSnapshot.with_changes`) pays again only for the host that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fleet.mig import Instance
from fleet.mps import MpsRequest
from fleet.placement import migfit, rules
from fleet.placement.fragment import Fragmentation, HostKey, scorer_for
from fleet.placement.mix import RequestMix
from fleet.placement.options import options, request_key, room
from fleet.placement.ranking import Ranking, Refusal, Target
from fleet.placement.signature import FULL_SIG, Sig, fit_key, gpu_sig, intern, register
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostGroup,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

FREE_PARTITION_BONUS = 1000.0

Item = tuple[int, int, int, int, int | None, Instance | None, tuple[int, ...]]
"""A scored target: score, snapshot position, order on the GPU, GPU, partition, instance, GPUs."""
_Entry = tuple[tuple[int, int, int], Item, tuple[Item, ...] | None]
"""A host's answer: the best item's sort key (score, -position, -order), it, and every item
(``None`` when the answer came from an equal host's template: built when the list is read)."""
_Best = tuple[int, int | None, Instance | None]
"""The first best option of a GPU: its order, its locator, its new instance."""
_Template = tuple[int, tuple[tuple[Any, _Best], ...]]
"""A host state's answer to one request: the best score, and for each GPU key that reaches it,
the GPU's first option that does."""
_NONE: _Template = (-1, ())
_WORST = (-(10**9), 0, 0)
_MISSING: Any = object()
_HOST_STATE = "mixfit.host_state"
_FIT_STATE = "mixfit.fit_state"


def rank_product(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    mix: RequestMix | None,
    demand: Demand | None,
    refusals: Callable[[], tuple[Refusal, ...]],
) -> Ranking:
    """Rank ``request`` with the product strategy; ``refusals`` builds the infeasible list."""
    scorer = scorer_for(mix)
    if isinstance(request, MpsRequest) and not rules.request_valid(request):
        return Ranking.deferred(None, tuple, refusals)
    slot = scorer.slot_of((request_key(request), demand_key(demand)))
    best: _Entry | None = None
    best_key = _WORST
    entries: list[tuple[_Entry | _Lazy, HostGroup]] = []
    avoid = demand is not None and bool(demand.avoid_hosts)
    for group in snapshot.host_groups:
        if avoid and rules.avoided(group.host, demand):
            continue  # before the memo: its answers do not know the hosts to avoid
        memo = group.memo
        entry = memo.get(slot, _MISSING)
        if entry is _MISSING:
            entry = memo[slot] = _group_entry(scorer, group, request, demand, slot)
        if entry is None:
            continue
        if entry.__class__ is _Lazy:
            # A host whose answer is known by its state: build its best target only if it
            # could beat the best so far (a higher score, or an equal one earlier in the order).
            score = entry.score
            if score < best_key[0] or (score == best_key[0] and -group.positions[0] < best_key[1]):
                entries.append((entry, group))
                continue
            entry = memo[slot] = _materialize(entry, group, request, demand)
            if entry is None:
                continue
        entries.append((entry, group))
        if entry[0] > best_key:
            best_key, best = entry[0], entry

    def feasible() -> tuple[Target, ...]:
        every: list[Item] = []
        for found, group in entries:
            every.extend(_entry_items(scorer, group, request, demand, found))
        return tuple(_target(i) for i in sorted(every, key=item_order))

    return Ranking.deferred(None if best is None else _target(best[1]), feasible, refusals)


def item_order(item: Item) -> tuple[int, int, int]:
    """Where an item stands in :attr:`Ranking.feasible` (best first, ties in snapshot order)."""
    return (-item[0], item[1], item[2])


def ranked_items(
    snapshot: FleetSnapshot,
    request: PlacementRequest,
    mix: RequestMix | None,
    demand: Demand | None,
    host_ids: frozenset[int] | set[int] | None = None,
) -> list[Item]:
    """The items of :func:`rank_product`'s ``feasible`` list, in its order, on the hosts in
    ``host_ids`` only when given: a planner that changes a few hosts of a snapshot ranks them
    alone and reads the rest from the unchanged snapshot's list (:func:`item_target` makes
    each a :class:`Target`)."""
    scorer = scorer_for(mix)
    if isinstance(request, MpsRequest) and not rules.request_valid(request):
        return []
    slot = scorer.slot_of((request_key(request), demand_key(demand)))
    avoid = demand is not None and bool(demand.avoid_hosts)
    if host_ids is None:
        groups: Iterable[HostGroup] = snapshot.host_groups
    else:
        groups = [g for h in host_ids if (g := snapshot.group(h)) is not None]
    every: list[Item] = []
    for group in groups:
        if avoid and rules.avoided(group.host, demand):
            continue
        memo = group.memo
        entry = memo.get(slot, _MISSING)
        if entry is _MISSING:
            entry = memo[slot] = _group_entry(scorer, group, request, demand, slot)
        if entry is not None:
            every.extend(_entry_items(scorer, group, request, demand, entry))
    every.sort(key=item_order)
    return every


def item_target(item: Item) -> Target:
    """The target an item of :func:`ranked_items` names."""
    return _target(item)


def _entry_items(
    scorer: Fragmentation,
    group: HostGroup,
    request: PlacementRequest,
    demand: Demand | None,
    found: _Entry | _Lazy,
) -> tuple[Item, ...]:
    """Every item of a host's answer (built from an equal host's template where needed)."""
    made = _materialize(found, group, request, demand) if isinstance(found, _Lazy) else found
    if made is None:
        return ()
    items = made[2]
    if items is None:
        assert not isinstance(request, WholeGpuRequest)
        items = tuple(i for i, _, _ in _group_scored(scorer, group, request, demand))
    return items


@dataclass(frozen=True, slots=True)
class _Lazy:
    """A host's answer known from an equal host's: its best score, and how to find its target."""

    score: int
    template: _Template | None


def _materialize(
    lazy: _Lazy, group: HostGroup, request: PlacementRequest, demand: Demand | None
) -> _Entry | None:
    if lazy.template is not None:
        return _from_template(group, demand, lazy.template)
    assert isinstance(request, WholeGpuRequest)
    chosen = _whole_chosen(group, request, demand)
    if chosen is None:
        return None
    ids = tuple(gpu.id for _, gpu in chosen)
    item: Item = (lazy.score, chosen[0][0], 0, ids[0], None, None, ids)
    return _key(item), item, (item,)


def gpu_targets(
    snapshot: FleetSnapshot,
    gpu: GpuState,
    request: MigRequest | MpsRequest,
    mix: RequestMix | None,
    demand: Demand | None,
) -> list[Target]:
    """The product strategy's targets on one GPU (whose host takes the request), scored as
    :func:`rank_product` scores them."""
    group = snapshot.group(gpu.host_id)
    if group is None:
        return []
    scorer = scorer_for(mix)
    position = group.positions[group.gpus.index(gpu)]
    items = _gpu_items(scorer, group, gpu, position, request, demand)
    return [_target(i) for i, _ in items]


def _target(item: Item) -> Target:
    score, _, _, gpu_id, partition_id, instance, gpu_ids = item
    return Target(gpu_id, partition_id, instance, float(score), gpu_ids)


def demand_key(demand: Demand | None) -> tuple[Any, ...]:
    if demand is None:
        return ()
    return (
        demand.cpu_milli,
        demand.host_memory_mib,
        demand.products,
        demand.runtimes,
        demand.process_runtime,
        demand.host_labels,
        demand.team,
    )


def host_state(scorer: Fragmentation, group: HostGroup) -> tuple[int, HostKey]:
    """The group's host state: its id and key (memoised on the group, whatever the mix)."""
    state = group.memo.get(_HOST_STATE)
    if state is None:
        for gpu in group.gpus:
            register(gpu)
        key = scorer.host_key(group)
        state = group.memo[_HOST_STATE] = (intern(key), key)
    return state


def _group_entry(
    scorer: Fragmentation,
    group: HostGroup,
    request: PlacementRequest,
    demand: Demand | None,
    slot: int,
) -> _Entry | _Lazy | None:
    if not rules.host_takes(group.host, demand):
        return None
    if isinstance(request, WholeGpuRequest):
        if room(group, "gpu") < request.count:
            return None
        return _whole_entry(scorer, group, request, demand, slot)
    if isinstance(request, MpsRequest) and room(group, "mps") < request.memory_mib:
        return None
    if isinstance(request, MigRequest) and not room(group, "mig"):
        return None
    fid = _fit_state(scorer, group)
    template = scorer.templates.get((fid, slot)) if fid is not None else None
    if template is not None:
        return _Lazy(template[0], template) if template[1] else None
    scored = _group_scored(scorer, group, request, demand)
    if not scored:
        if fid is not None:
            scorer.remember((fid, slot), _NONE)
        return None
    top = max((item for item, _, _ in scored), key=_key)
    if fid is not None:
        best: dict[Any, _Best] = {}
        for item, fit, locator in scored:
            if item[0] == top[0] and fit not in best:
                best[fit] = (item[2], locator, item[5])
        scorer.remember((fid, slot), (top[0], tuple(best.items())))
    return _key(top), top, tuple(item for item, _, _ in scored)


def _fit_state(scorer: Fragmentation, group: HostGroup) -> int | None:
    """An id for the group's host state and its GPUs' fit keys (equal ids, equal answers)."""
    if _FIT_STATE in group.memo:
        found: int | None = group.memo[_FIT_STATE]
        return found
    keys = [fit_key(gpu) for gpu in group.gpus]
    fid = None
    if group.host is not None and all(k is not None for k in keys):
        host = group.host
        ordered = tuple(sorted(keys))  # type: ignore[type-var]
        fid = intern(("fit", host.cpu_free_milli, host.memory_free_mib, ordered))
    group.memo[_FIT_STATE] = fid
    return fid


def _from_template(group: HostGroup, demand: Demand | None, template: _Template) -> _Entry | None:
    score, pairs = template
    if not pairs:
        return None
    best = dict(pairs)
    for gpu, position in zip(group.gpus, group.positions, strict=True):
        found = best.get(fit_key(gpu))
        if found is None or not rules.gpu_takes(gpu, demand):
            continue
        order, locator, instance = found
        if locator is None:
            partition_id = None if instance is not None else gpu.whole_partition_id
        else:
            partition_id = next(p.id for p in gpu.partitions if p.start == locator)
        item: Item = (score, position, order, gpu.id, partition_id, instance, (gpu.id,))
        return _key(item), item, None
    raise AssertionError("a host in the template's state lacks the template's best target")


def _group_scored(
    scorer: Fragmentation, group: HostGroup, request: MigRequest | MpsRequest, demand: Demand | None
) -> list[tuple[Item, Any, int | None]]:
    """Every item of the group, with its GPU's fit key and the item's locator."""
    scored: list[tuple[Item, Any, int | None]] = []
    scores: dict[tuple[Sig, Sig], int] = {}
    for gpu, position in zip(group.gpus, group.positions, strict=True):
        if rules.gpu_takes(gpu, demand):
            fit = fit_key(gpu)
            scored.extend(
                (item, fit, locator)
                for item, locator in _gpu_items(
                    scorer, group, gpu, position, request, demand, scores
                )
            )
    return scored


def _key(item: Item) -> tuple[int, int, int]:
    return (item[0], -item[1], -item[2])


def _gpu_items(
    scorer: Fragmentation,
    group: HostGroup,
    gpu: GpuState,
    position: int,
    request: MigRequest | MpsRequest,
    demand: Demand | None,
    scores: dict[tuple[Sig, Sig], int] | None = None,
) -> list[tuple[Item, int | None]]:
    """The GPU's items, each with its locator (see :data:`fleet.placement.options.Option`)."""
    found = options(gpu, request)
    if not found:
        return []
    if scores is None:
        scores = {}
    state = host_state(scorer, group)
    sig = gpu_sig(gpu)
    cpu, memory = (demand.cpu_milli, demand.host_memory_mib) if demand is not None else (0, 0)
    bonus = int(FREE_PARTITION_BONUS) if isinstance(request, MigRequest) else 0
    items: list[tuple[Item, int | None]] = []
    created: list[tuple[Item, int | None]] = []
    for order, (partition_id, instance, after, locator) in enumerate(found):
        score = scores.get((sig, after))
        if score is None:
            score = scores[(sig, after)] = scorer.delta_score(state, (sig,), (after,), cpu, memory)
        if instance is None:
            item: Item = (score + bonus, position, order, gpu.id, partition_id, None, (gpu.id,))
            items.append((item, locator))
        else:
            created.append(((score, position, order, gpu.id, None, instance, (gpu.id,)), locator))
    if created:
        items.append(_best_instance(gpu, created))
    return items


def _best_instance(
    gpu: GpuState, created: list[tuple[Item, int | None]]
) -> tuple[Item, int | None]:
    """The one new instance a GPU offers: the best score; among equals, the placement that
    keeps the most profile sizes placeable (:func:`migfit.fragmentation`), then the first."""
    top = max(item[0] for item, _ in created)
    tied = [pair for pair in created if pair[0][0] == top]
    product = migfit.product_of(gpu)
    if len(tied) == 1 or product is None:
        return tied[0]
    layout = tuple(Instance(p.profile_id, p.start) for p in gpu.partitions)

    def growth(pair: tuple[Item, int | None]) -> tuple[int, int]:
        instance = pair[0][5]
        assert instance is not None
        return (migfit.fragmentation(product, (*layout, instance)), pair[0][2])

    return min(tied, key=growth)


def _whole_chosen(
    group: HostGroup, request: WholeGpuRequest, demand: Demand | None
) -> list[tuple[int, GpuState]] | None:
    """The first ``count`` free dedicated GPUs of the group, with their positions."""
    chosen: list[tuple[int, GpuState]] = []
    for gpu, position in zip(group.gpus, group.positions, strict=True):
        if rules.whole_free(gpu, demand):
            chosen.append((position, gpu))
            if len(chosen) == request.count:
                return chosen
    return None


def _whole_entry(
    scorer: Fragmentation,
    group: HostGroup,
    request: WholeGpuRequest,
    demand: Demand | None,
    slot: int,
) -> _Entry | _Lazy | None:
    # Equal hosts whose free GPUs are all alike take the same GPUs, with the same score.
    fid = _fit_state(scorer, group)
    known = scorer.templates.get((fid, slot)) if fid is not None else None
    if known is not None:
        return None if known < 0 else _Lazy(known, None)
    chosen = _whole_chosen(group, request, demand)
    if chosen is None:
        if fid is not None:
            scorer.remember((fid, slot), -1)
        return None
    old = tuple(gpu_sig(gpu) for _, gpu in chosen)
    state = host_state(scorer, group)
    cpu, memory = (demand.cpu_milli, demand.host_memory_mib) if demand is not None else (0, 0)
    score = scorer.delta_score(state, old, (FULL_SIG,) * len(chosen), cpu, memory)
    free = {gpu_sig(gpu) for gpu in group.gpus if rules.whole_free(gpu, demand)}
    if fid is not None and len(free) == 1:
        scorer.remember((fid, slot), score)
    ids = tuple(gpu.id for _, gpu in chosen)
    item: Item = (score, chosen[0][0], 0, ids[0], None, None, ids)
    return _key(item), item, (item,)
