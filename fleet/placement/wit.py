"""What would it take? The smallest actions that would place one waiting replica, ranked.

Stdlib only. The service (:mod:`fleet.sharing.wit`) builds each candidate :class:`Plan` from the
planners Fleet already has (the defrag planner's fewest moves and the repack solver's bound, the
layout advisor, the reclaim plan, the team's sharing rules) and this module ranks them, computes
a quota change, and says when the fleet already knows the replica will fit.

**Ranking** (:func:`rank_plans`), least harm first: a plan that stops nobody's replica beats one
that stops some; then the fewest replicas moved (each make-before-break); then a plan that
changes no policy (a quota) beats one that does; then the fewest GPUs reshaped; then the kind
(:data:`KIND_ORDER`). Waiting (no action) always comes last: it is what happens when nobody
acts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fleet.placement.quota import Quota, Usage
from fleet.placement.release import without
from fleet.placement.sharing import BORROW_UNAVAILABLE, Sharing, sharing_verdict
from fleet.placement.snapshot import FleetSnapshot, GpuState

PlanKind = Literal["place", "moves", "reshape", "quota", "stop", "wait"]
KIND_ORDER: dict[str, int] = {
    "place": 0,
    "moves": 1,
    "reshape": 2,
    "quota": 3,
    "stop": 4,
    "wait": 9,
}
"""Ties broken by kind: placing at once, moving, reshaping, a quota change, stopping, waiting."""

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]


@dataclass(frozen=True)
class ApiRequest:
    """One request of a plan, exactly as it is sent (``path`` under ``/api/v1``); ``after``:
    what it waits for once the request before it answered (``""``: nothing; ``operation``: the
    operation that request started has succeeded; ``released``: the replicas it stopped have
    given back their slices)."""

    method: Method
    path: str
    body: Mapping[str, Any] | None = None
    after: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "body": self.body, "after": self.after}


@dataclass(frozen=True)
class Plan:
    """One way to place the replica.

    Attributes:
        kind: what it does (:data:`PlanKind`).
        summary: one sentence.
        requests: the API requests that apply it, in order (none for ``wait``).
        moved: running replicas it moves (make before break).
        stopped: running replicas it stops (they wait again).
        reshaped: GPUs whose MIG layout it changes.
        changes_policy: it changes a team's quota.
        destructive: it stops or moves someone's replica, or reshapes a GPU (the dialog asks
            to confirm).
        role: who may apply it: ``team_operator`` (the replica's team), ``operator``,
            ``admin``; ``""`` for nothing to apply.
        proof: why no smaller plan of its kind exists (``bound``, ``method``, ``status``).
        details: what the plan names (moves, stops, the quota body's reasons, a time).
    """

    kind: PlanKind
    summary: str
    requests: tuple[ApiRequest, ...] = ()
    moved: int = 0
    stopped: int = 0
    reshaped: int = 0
    changes_policy: bool = False
    destructive: bool = False
    role: str = ""
    proof: Mapping[str, Any] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cost(self) -> tuple[int, int, int, int, int]:
        """The ranking key (lower first): stops, moves, a policy change, reshapes, the kind."""
        if self.kind == "wait":
            return (1 << 30, 0, 0, 0, KIND_ORDER["wait"])
        return (
            self.stopped,
            self.moved,
            int(self.changes_policy),
            self.reshaped,
            KIND_ORDER[self.kind],
        )


def rank_plans(plans: Iterable[Plan]) -> list[Plan]:
    """The plans, least harm first (:attr:`Plan.cost`); a stable sort keeps the order given
    among equals."""
    return sorted(plans, key=lambda p: p.cost)


def with_prefix(plan: Plan, first: Sequence[ApiRequest], role: str, note: str) -> Plan:
    """``plan`` preceded by ``first`` (a quota change it also needs): the higher role applies
    it, and it changes a policy."""
    return replace(
        plan,
        requests=(*first, *plan.requests),
        role=higher_role(plan.role, role),
        changes_policy=True,
        summary=f"{note} {plan.summary}",
    )


ROLE_ORDER = {"": 0, "team_operator": 1, "operator": 2, "admin": 3}


def higher_role(a: str, b: str) -> str:
    return a if ROLE_ORDER.get(a, 0) >= ROLE_ORDER.get(b, 0) else b


# -- a quota change ---------------------------------------------------------------------------


_KINDS = ("gpus", "mig_compute_slices", "mps_memory_mib")


def _wanted(in_use: Usage, demand: Usage) -> dict[str, int]:
    """What the team would hold, kind by kind, with the replica (only kinds it asks for)."""
    found = {
        kind: getattr(in_use, kind) + getattr(demand, kind)
        for kind in _KINDS
        if getattr(demand, kind) > 0
    }
    for profile, n in demand.mig_profiles.items():
        if n > 0:
            found[f"mig_profiles.{profile}"] = in_use.mig_profiles.get(profile, 0) + n
    return found


def _get(quota: Quota, kind: str) -> int | None:
    if kind.startswith("mig_profiles."):
        return quota.mig_profiles.get(kind.split(".", 1)[1])
    value: int | None = getattr(quota, kind)
    return value


def _set(quota: Quota, kind: str, value: int) -> Quota:
    if kind.startswith("mig_profiles."):
        return replace(quota, mig_profiles={**quota.mig_profiles, kind.split(".", 1)[1]: value})
    changes: dict[str, Any] = {kind: value}
    return replace(quota, **changes)


def _body_of(quota: Quota, kinds: Iterable[str]) -> dict[str, Any]:
    """The kinds changed, as ``PUT /teams/{id}/quota`` takes them (``mig_profiles`` whole)."""
    body: dict[str, Any] = {}
    for kind in kinds:
        if kind.startswith("mig_profiles."):
            body["mig_profiles"] = dict(quota.mig_profiles)
        else:
            body[kind] = getattr(quota, kind)
    return body


@dataclass(frozen=True)
class QuotaChange:
    """The smallest change of a team's sharing that admits the replica: the exact body of
    ``PUT /teams/{id}/quota``, and the kinds it raises (``deserved`` or ``limit``)."""

    body: dict[str, Any]
    raised: tuple[tuple[str, str, int | None, int], ...]  # (where, kind, from, to)
    borrowed: bool  # the replica would be borrowed after it


def quota_change(
    sharing: Sharing, in_use: Usage, demand: Usage, free: Usage, others_need: Usage
) -> QuotaChange | None:
    """The smallest quota change after which :func:`sharing_verdict` admits ``demand``: first
    raise only the limits it passes (it stays borrowed, if what stays free lets it borrow),
    else raise the deserved share of each kind it needs to what the team would hold with it
    (guaranteed: the borrowing check no longer applies). ``None`` when it is admitted already.
    """
    if sharing_verdict(sharing, in_use, demand, free, others_need).allowed:
        return None
    wanted = _wanted(in_use, demand)
    deserved, limit = sharing.deserved, sharing.limit
    raised_limit = []
    for kind, total in wanted.items():
        current = _get(limit, kind)
        if current is not None and current < total:
            limit = _set(limit, kind, total)
            raised_limit.append(("limit", kind, current, total))
    if raised_limit:
        verdict = sharing_verdict(Sharing(deserved, limit), in_use, demand, free, others_need)
        if verdict.allowed:
            body = {"limit": _body_of(limit, [k for _, k, _, _ in raised_limit])}
            return QuotaChange(body, tuple(raised_limit), verdict.borrowed)
    # Guaranteed instead: each kind's deserved share (and limit, where set) to cover it.
    raised = []
    deserved, limit = sharing.deserved, sharing.limit
    for kind, total in wanted.items():
        current = _get(deserved, kind)
        capped = _get(limit, kind)
        bounded = current is not None or capped is not None
        if bounded and (current is None or current < total):
            deserved = _set(deserved, kind, total)
            raised.append(("deserved", kind, current, total))
        if capped is not None and capped < total:
            limit = _set(limit, kind, total)
            raised.append(("limit", kind, capped, total))
    body = _body_of(deserved, [k for w, k, _, _ in raised if w == "deserved"])
    limit_kinds = [k for w, k, _, _ in raised if w == "limit"]
    if limit_kinds:
        body["limit"] = _body_of(limit, limit_kinds)
    verdict = sharing_verdict(Sharing(deserved, limit), in_use, demand, free, others_need)
    if not verdict.allowed or not raised:
        return None
    return QuotaChange(body, tuple(raised), verdict.borrowed)


def blocked_by_borrowing(codes: Iterable[str]) -> bool:
    return BORROW_UNAVAILABLE in set(codes)


# -- the earliest time it fits ------------------------------------------------------------------


ReleaseKey = tuple[str, int]
"""``("mig" | "mps", allocation id)`` or ``("gpu", gpu id)``: a slice being given back."""


@dataclass(frozen=True)
class Release:
    """A slice the fleet already gives back: a replica releasing (stopping), or the old copy
    of a move in flight, on ``gpu_id``; ``by_s`` when it is known to be free at the latest
    (``None``: when its workload exits, which no one can say)."""

    key: ReleaseKey
    gpu_id: int
    by_s: float | None = None
    what: str = ""


def _released(gpu: GpuState, key: ReleaseKey) -> GpuState:
    kind, ident = key
    if kind == "gpu":
        return replace(gpu, taken=False)
    return without(gpu, ident)


def after_releases(snapshot: FleetSnapshot, releases: Sequence[Release]) -> FleetSnapshot:
    """The fleet once ``releases`` are done."""
    gpus: dict[int, GpuState] = {}
    for r in releases:
        gpu = gpus.get(r.gpu_id) or snapshot.gpu(r.gpu_id)
        if gpu is not None:
            gpus[r.gpu_id] = _released(gpu, r.key)
    return snapshot.with_changes(gpus=gpus.values())


def fewest_releases(
    releases: Sequence[Release], fits: Any, snapshot: FleetSnapshot
) -> tuple[Release, ...] | None:
    """The shortest prefix of ``releases`` (ordered soonest first: known times, then unknown)
    after which ``fits(snapshot)`` holds; ``None`` when even all of them are not enough. More
    released never fits less, so the prefix is found by bisection."""
    ordered = sorted(
        releases, key=lambda r: (r.by_s is None, r.by_s if r.by_s is not None else 0.0)
    )
    if not ordered or not fits(after_releases(snapshot, ordered)):
        return None
    low, high = 1, len(ordered)
    while low < high:
        middle = (low + high) // 2
        if fits(after_releases(snapshot, ordered[:middle])):
            high = middle
        else:
            low = middle + 1
    return tuple(ordered[:low])
