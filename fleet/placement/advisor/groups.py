"""The layout advisor for waiting replicas that may not all go to every GPU: the groups solved
in turn, each on its own GPUs as the earlier ones left them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from fleet.placement.advisor.solver import advise
from fleet.placement.advisor.values import (
    DEFAULT_TIME_LIMIT_S,
    Advice,
    AdvisorGpu,
    ExistingInstance,
    GpuAdvice,
    NewInstance,
    WaitingGroup,
)


def advise_groups(
    gpus: Sequence[AdvisorGpu],
    groups: Sequence[WaitingGroup],
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    clock: Callable[[], float] | None = None,
) -> Advice:
    """:func:`advise` for waiting replicas that may not all go to every GPU.

    One group that may use every GPU is :func:`advise` itself. Otherwise the groups are solved
    in turn, the one with the fewest GPUs first, each on its own GPUs as the earlier ones left
    them: the instances an earlier group took count as busy, and a GPU an earlier group changed
    or took instances of is not drained again (its new replicas would move to GPUs their
    deployments may not use). With several groups the answer's status is ``sequential``
    (unless a step was only ``feasible`` or ``heuristic``, then that): each step is
    solved as :func:`advise` solves it, and ``bound`` is the sum of the steps' bounds, a bound
    of what each step could do from where the earlier ones left it, not of a joint plan.
    """
    if len(groups) == 1 and groups[0].gpu_ids >= {g.id for g in gpus}:
        only = groups[0]
        return advise(
            _pinned(gpus, only.gpu_ids), only.mig, only.mps, time_limit_s=time_limit_s, clock=clock
        )
    state = {g.id: g for g in gpus}
    # Per GPU, its instances now: as the answer's NewInstance (``existing``: the index among
    # the GPU's instances in ``gpus``) and how many replicas each holds.
    plan: dict[int, list[tuple[NewInstance, int]]] = {
        g.id: [
            (NewInstance(i.profile_id, i.start, n, mps=i.mps), i.replicas)
            for n, i in enumerate(g.instances)
        ]
        for g in gpus
    }
    drained: set[int] = set()
    placed: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    objective = bound = 0
    elapsed = 0.0
    statuses: list[str] = []
    weights: dict[str, int] = {}
    steps = sorted(groups, key=lambda group: (len(group.gpu_ids), sorted(group.gpu_ids)))
    for group in steps:
        members = _pinned([state[g.id] for g in gpus if g.id in group.gpu_ids], group.gpu_ids)
        step = advise(
            members, group.mig, group.mps, time_limit_s=time_limit_s / len(steps), clock=clock
        )
        placed.update(step.placed)
        waiting.update(step.waiting)
        objective += step.objective
        bound += step.bound
        elapsed += step.time_s
        statuses.append(step.status)
        weights = weights or step.weights
        for proposal in step.gpus:
            if not proposal.changed and not any(i.serves for i in proposal.instances):
                continue
            before = plan[proposal.gpu_id]
            after: list[tuple[NewInstance, int]] = []
            for i in proposal.instances:
                kept = before[i.existing] if i.existing is not None else None
                original = kept[0].existing if kept is not None else None
                if kept is not None and not proposal.drained and not i.serves:
                    after.append(kept)  # as it was: running, or taken by an earlier step, or idle
                else:
                    after.append(
                        (
                            NewInstance(
                                i.profile_id, i.start, original, i.serves, i.replicas, i.mps
                            ),
                            i.replicas,
                        )
                    )
            plan[proposal.gpu_id] = after
            if proposal.drained:
                drained.add(proposal.gpu_id)
            g = state[proposal.gpu_id]
            state[proposal.gpu_id] = AdvisorGpu(
                g.id,
                g.product,
                tuple(ExistingInstance(i.profile_id, i.start, n, i.mps) for i, n in after),
                drainable=False,
            )
    answer: list[GpuAdvice] = []
    for g in gpus:
        instances = tuple(i for i, _ in plan[g.id])
        now = sorted((i.profile_id, i.start, i.mps) for i in g.instances)
        then = sorted((i.profile_id, i.start, i.mps) for i in instances)
        gone = g.id in drained
        answer.append(
            GpuAdvice(g.id, instances, gone or now != then, gone, g.busy_replicas if gone else 0)
        )
    if len(statuses) == 1:  # one group, on some of the GPUs: solved as advise() solves it
        status = statuses[0]
    elif any(status in ("heuristic", "feasible") for status in statuses):
        status = "heuristic" if "heuristic" in statuses else "feasible"
    else:
        status = "sequential"
    gap = 100.0 * (bound - objective) / abs(bound) if bound else 0.0
    return Advice(
        tuple(answer),
        dict(placed),
        dict(waiting),
        sum(a.moved_replicas for a in answer),
        objective,
        bound,
        round(max(gap, 0.0), 4),
        status,
        round(elapsed, 3),
        weights,
    )


def _pinned(gpus: Sequence[AdvisorGpu], ids: frozenset[int]) -> list[AdvisorGpu]:
    """``gpus``, those whose running replicas may not move to every other GPU of ``ids`` made
    not drainable (a drain's replicas may land on any of them)."""
    return [
        replace(g, drainable=False)
        if g.drainable and g.movable_to is not None and not (ids - {g.id}) <= g.movable_to
        else g
        for g in gpus
    ]
