"""Sharing between teams: deserved shares, limits and borrowing (docs/sharing.md).

Stdlib only. A team's quota is its *deserved* share (guaranteed) and its *limit* (the most it
may hold, borrowed replicas included). Per kind of capacity:

* no deserved share and no limit: unbounded, never borrowed (a team without quota, as before);
* a deserved share and no limit: the share is a hard cap (no borrowing of that kind);
* a limit and no deserved share: the team only borrows it (its deserved share is 0);
* both: up to the share is guaranteed, past it up to the limit is borrowed.

A replica that passes its team's deserved share is *borrowed*: it is allowed only on capacity
that no other team's deserved share needs now, i.e. what stays free after it must still cover
every other team's waiting replicas within their deserved shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fleet.domain import Violation
from fleet.placement.quota import Quota, Usage, minus, plus, quota_violations

BORROW_UNAVAILABLE = "quota.borrow_unavailable"


@dataclass(frozen=True)
class Sharing:
    """A team's deserved share and its limit (each a :class:`Quota`, ``None`` kinds unbounded)."""

    deserved: Quota = field(default_factory=Quota)
    limit: Quota = field(default_factory=Quota)

    @property
    def bounded(self) -> bool:
        return self.deserved.bounded or self.limit.bounded

    def cap(self) -> Quota:
        """What the team may hold at most: each kind's limit, else its deserved share."""
        d, lim = self.deserved, self.limit
        return Quota(
            gpus=lim.gpus if lim.gpus is not None else d.gpus,
            mig_compute_slices=(
                lim.mig_compute_slices
                if lim.mig_compute_slices is not None
                else d.mig_compute_slices
            ),
            mps_memory_mib=lim.mps_memory_mib
            if lim.mps_memory_mib is not None
            else d.mps_memory_mib,
            mig_profiles={**d.mig_profiles, **lim.mig_profiles},
        )

    def guaranteed(self) -> Quota:
        """The share past which a replica is borrowed: each kind's deserved share, else 0 where
        a limit is set (the team only borrows it), else unbounded."""
        d, lim = self.deserved, self.limit

        def share(own: int | None, limit: int | None) -> int | None:
            return own if own is not None else (0 if limit is not None else None)

        profiles = dict.fromkeys(lim.mig_profiles, 0)
        profiles.update(d.mig_profiles)
        return Quota(
            gpus=share(d.gpus, lim.gpus),
            mig_compute_slices=share(d.mig_compute_slices, lim.mig_compute_slices),
            mps_memory_mib=share(d.mps_memory_mib, lim.mps_memory_mib),
            mig_profiles=profiles,
        )


@dataclass(frozen=True)
class Verdict:
    """What a team's sharing rules say of one more replica: refused (``violations``), or allowed,
    ``borrowed`` when it passes the team's deserved share."""

    violations: tuple[Violation, ...] = ()
    borrowed: bool = False

    @property
    def allowed(self) -> bool:
        return not self.violations


def _kinds(usage: Usage) -> dict[str, int]:
    """The kinds the borrowing check weighs: capacity in bulk. Replicas per MIG profile are
    bounded by the cap only: free capacity is counted in compute slices, which any profile
    may be cut from."""
    return {
        "gpus": usage.gpus,
        "mig_compute_slices": usage.mig_compute_slices,
        "mps_memory_mib": usage.mps_memory_mib,
    }


def borrow_violations(demand: Usage, free: Usage, others_need: Usage) -> list[Violation]:
    """Each kind the replica asks for where what stays free after it would not cover what the
    other teams' deserved shares need now (their waiting replicas within their shares)."""
    free_kinds, need_kinds = _kinds(free), _kinds(others_need)
    found = []
    for kind, asked in sorted(_kinds(demand).items()):
        left, needed = free_kinds.get(kind, 0) - asked, need_kinds.get(kind, 0)
        if asked > 0 and left < needed:
            found.append(
                Violation(
                    BORROW_UNAVAILABLE,
                    f"Borrowing {asked} of {kind} would leave {max(left, 0)} free while other "
                    f"teams' deserved shares wait for {needed}.",
                    {
                        "limit": kind,
                        "free": free_kinds.get(kind, 0),
                        "needed": needed,
                        "requested": asked,
                    },
                )
            )
    return found


def sharing_verdict(
    sharing: Sharing, in_use: Usage, demand: Usage, free: Usage, others_need: Usage
) -> Verdict:
    """Whether the team may hold ``demand`` more on top of ``in_use``, and whether it borrows.

    Past the team's cap (its limit, else its deserved share): refused (``quota.exceeded``).
    Within its deserved share: guaranteed. Between the two: borrowed, if what stays ``free``
    covers ``others_need`` (else ``quota.borrow_unavailable``)."""
    over_cap = quota_violations(sharing.cap(), in_use, demand)
    if over_cap:
        return Verdict(tuple(over_cap))
    if not quota_violations(sharing.guaranteed(), in_use, demand):
        return Verdict()
    return Verdict(tuple(borrow_violations(demand, free, others_need)), borrowed=True)


def deserved_need(sharing: Sharing, in_use: Usage, waiting: Usage) -> Usage:
    """What a team's deserved share needs now: its waiting demand, kind by kind, up to what
    its deserved share has left (nothing of a kind it has no deserved share of)."""
    d = sharing.deserved

    def need(share: int | None, used: int, wanted: int) -> int:
        return 0 if share is None else max(0, min(wanted, share - used))

    return Usage(
        gpus=need(d.gpus, in_use.gpus, waiting.gpus),
        mig_compute_slices=need(
            d.mig_compute_slices, in_use.mig_compute_slices, waiting.mig_compute_slices
        ),
        mps_memory_mib=need(d.mps_memory_mib, in_use.mps_memory_mib, waiting.mps_memory_mib),
        mig_profiles={
            p: n
            for p, wanted in waiting.mig_profiles.items()
            if (n := need(d.mig_profiles.get(p), in_use.mig_profiles.get(p, 0), wanted)) > 0
        },
    )


def others_deserved_need(
    team_id: int,
    sharing: Mapping[int, Sharing],
    held: Mapping[int, Usage],
    waiting: Mapping[int, Usage],
) -> Usage:
    """What every team but ``team_id`` needs now for its deserved share
    (:func:`deserved_need` of each, added up); a team without a deserved share needs nothing."""
    total = Usage()
    for other, its_sharing in sharing.items():
        wanted = waiting.get(other, Usage())
        if other == team_id or wanted == Usage():
            continue
        total = plus(total, deserved_need(its_sharing, held.get(other, Usage()), wanted))
    return total


@dataclass(frozen=True)
class Standing:
    """Where the teams stand at one moment, to judge a sequence of placements in memory (what
    what-would-it-take counts the queue doing before a replica): each bounded team's sharing,
    holdings and waiting demand, and the fleet's free capacity in bulk. A team absent from
    ``sharing`` is unbounded: always admitted, never borrowing."""

    sharing: Mapping[int, Sharing]
    held: Mapping[int, Usage]
    waiting: Mapping[int, Usage]
    free: Usage

    def verdict(self, team_id: int, demand: Usage) -> Verdict:
        """:func:`sharing_verdict` of ``demand`` more for the team (the fleet's free capacity
        and the other teams' needs weighed only where it would borrow)."""
        sharing = self.sharing.get(team_id)
        if sharing is None:
            return Verdict()
        in_use = self.held.get(team_id, Usage())
        quick = sharing_verdict(sharing, in_use, demand, Usage(), Usage())
        if not quick.borrowed:
            return quick
        others = others_deserved_need(team_id, self.sharing, self.held, self.waiting)
        return sharing_verdict(sharing, in_use, demand, self.free, others)

    def others_need(self, team_id: int) -> Usage:
        return others_deserved_need(team_id, self.sharing, self.held, self.waiting)

    def after(self, team_id: int, demand: Usage) -> Standing:
        """The standing once one waiting replica of the team holds ``demand``: the team holds
        it and waits for it no longer, and the fleet has that much less free."""
        if team_id not in self.sharing:
            return replace(self, free=minus(self.free, demand))
        return replace(
            self,
            held={**self.held, team_id: plus(self.held.get(team_id, Usage()), demand)},
            waiting={
                **self.waiting,
                team_id: minus(self.waiting.get(team_id, Usage()), demand),
            },
            free=minus(self.free, demand),
        )
