"""The pure sharing rules: a team's cap and guaranteed share from its deserved share and limit,
the verdict on one more replica (refused, guaranteed or borrowed), and what a team's deserved
share needs now."""

from __future__ import annotations

from fleet.placement.quota import Quota, Usage, minus
from fleet.placement.sharing import (
    BORROW_UNAVAILABLE,
    Sharing,
    Standing,
    Verdict,
    deserved_need,
    sharing_verdict,
)

NOTHING = Usage()
ONE_GPU = Usage(gpus=1)
PLENTY = Usage(gpus=100, mig_compute_slices=700, mps_memory_mib=10**7)


def test_a_deserved_share_without_a_limit_is_a_hard_cap_as_before():
    sharing = Sharing(deserved=Quota(gpus=2))
    assert sharing.cap() == Quota(gpus=2)
    assert sharing_verdict(sharing, Usage(gpus=1), ONE_GPU, PLENTY, NOTHING).borrowed is False
    refused = sharing_verdict(sharing, Usage(gpus=2), ONE_GPU, PLENTY, NOTHING)
    assert [v.code for v in refused.violations] == ["quota.exceeded"]


def test_past_the_deserved_share_up_to_the_limit_a_replica_is_borrowed():
    sharing = Sharing(deserved=Quota(gpus=2), limit=Quota(gpus=4))
    verdict = sharing_verdict(sharing, Usage(gpus=2), ONE_GPU, PLENTY, NOTHING)
    assert verdict.allowed and verdict.borrowed
    past = sharing_verdict(sharing, Usage(gpus=4), ONE_GPU, PLENTY, NOTHING)
    assert [v.details["limit"] for v in past.violations] == ["gpus"]
    assert past.violations[0].details["quota"] == 4


def test_a_limit_without_a_deserved_share_only_borrows():
    sharing = Sharing(limit=Quota(mps_memory_mib=40_000))
    assert sharing.guaranteed().mps_memory_mib == 0
    verdict = sharing_verdict(sharing, NOTHING, Usage(mps_memory_mib=10_000), PLENTY, NOTHING)
    assert verdict.allowed and verdict.borrowed


def test_a_team_without_quota_is_unbounded_and_never_borrows():
    sharing = Sharing()
    assert not sharing.bounded
    verdict = sharing_verdict(sharing, Usage(gpus=50), ONE_GPU, NOTHING, Usage(gpus=9))
    assert verdict.allowed and not verdict.borrowed


def test_borrowing_is_refused_where_what_stays_free_would_not_cover_others_deserved_needs():
    sharing = Sharing(deserved=Quota(gpus=1), limit=Quota(gpus=8))
    free, others = Usage(gpus=3), Usage(gpus=2)
    assert sharing_verdict(sharing, Usage(gpus=1), ONE_GPU, free, others).allowed
    refused = sharing_verdict(sharing, Usage(gpus=1), ONE_GPU, Usage(gpus=2), others)
    assert [v.code for v in refused.violations] == ["quota.borrow_unavailable"]
    assert refused.borrowed
    assert refused.violations[0].details == {
        "limit": "gpus",
        "free": 2,
        "needed": 2,
        "requested": 1,
    }


def test_a_guaranteed_replica_ignores_what_others_need():
    sharing = Sharing(deserved=Quota(gpus=2), limit=Quota(gpus=8))
    verdict = sharing_verdict(sharing, Usage(gpus=1), ONE_GPU, NOTHING, Usage(gpus=5))
    assert verdict.allowed and not verdict.borrowed


def test_borrowing_weighs_only_the_kinds_the_replica_asks_for():
    sharing = Sharing(limit=Quota(mig_compute_slices=14))
    demand = Usage(mig_compute_slices=2, mig_profiles={"2g.20gb": 1})
    others = Usage(gpus=9)  # whole GPUs another team waits for: not what this replica takes
    verdict = sharing_verdict(sharing, NOTHING, demand, Usage(mig_compute_slices=7), others)
    assert verdict.allowed and verdict.borrowed


def test_per_profile_limits_cap_and_deserved_profiles_guarantee():
    sharing = Sharing(
        deserved=Quota(mig_profiles={"1g.10gb": 1}), limit=Quota(mig_profiles={"1g.10gb": 2})
    )
    demand = Usage(mig_compute_slices=1, mig_profiles={"1g.10gb": 1})
    assert not sharing_verdict(sharing, NOTHING, demand, PLENTY, NOTHING).borrowed
    held = Usage(mig_compute_slices=1, mig_profiles={"1g.10gb": 1})
    assert sharing_verdict(sharing, held, demand, PLENTY, NOTHING).borrowed
    full = Usage(mig_compute_slices=2, mig_profiles={"1g.10gb": 2})
    assert not sharing_verdict(sharing, full, demand, PLENTY, NOTHING).allowed


def test_what_a_deserved_share_needs_is_its_waiting_demand_up_to_what_it_has_left():
    sharing = Sharing(deserved=Quota(gpus=4, mps_memory_mib=1000))
    need = deserved_need(
        sharing, Usage(gpus=3, mps_memory_mib=1200), Usage(gpus=5, mps_memory_mib=500)
    )
    assert (need.gpus, need.mps_memory_mib, need.mig_compute_slices) == (1, 0, 0)
    assert deserved_need(Sharing(limit=Quota(gpus=9)), NOTHING, Usage(gpus=3)) == NOTHING


# -- a standing: the verdicts of a sequence of placements, in memory --------------------------


def _standing(free: int) -> Standing:
    """Team 1 deserves 2 GPUs and waits for 2; teams 2 and 3 only borrow (limit 4); team 4
    is unbounded."""
    borrower = Sharing(limit=Quota(gpus=4))
    return Standing(
        sharing={1: Sharing(deserved=Quota(gpus=2)), 2: borrower, 3: borrower},
        held={1: NOTHING, 2: NOTHING, 3: NOTHING},
        waiting={1: Usage(gpus=2), 2: ONE_GPU, 3: ONE_GPU},
        free=Usage(gpus=free),
    )


def test_a_standing_judges_as_the_verdict_on_what_it_holds():
    standing = _standing(free=3)
    assert standing.others_need(2) == Usage(gpus=2)
    for team in (1, 2, 3):
        sharing = standing.sharing[team]
        assert standing.verdict(team, ONE_GPU) == sharing_verdict(
            sharing, standing.held[team], ONE_GPU, standing.free, standing.others_need(team)
        )
    assert standing.verdict(4, Usage(gpus=99)) == Verdict()  # unbounded: always admitted


def test_a_borrower_placed_ahead_can_leave_the_next_one_refused():
    standing = _standing(free=3)
    assert standing.verdict(3, ONE_GPU).allowed  # 3 free - 1 covers the 2 team 1 needs
    after = standing.after(2, ONE_GPU)
    assert (after.held[2], after.waiting[2], after.free) == (ONE_GPU, NOTHING, Usage(gpus=2))
    assert [v.code for v in after.verdict(3, ONE_GPU).violations] == [BORROW_UNAVAILABLE]


def test_a_deserved_replica_placed_ahead_changes_no_borrowers_verdict():
    # It takes from the free room exactly what it took from its team's need.
    standing = _standing(free=3)
    after = standing.after(1, ONE_GPU)
    assert after.others_need(3) == ONE_GPU and after.free == Usage(gpus=2)
    assert after.verdict(3, ONE_GPU) == standing.verdict(3, ONE_GPU)
    assert standing.after(4, ONE_GPU).held == standing.held  # unbounded: only the room


def test_minus_never_goes_below_nothing():
    a = Usage(gpus=1, mig_compute_slices=3, mig_profiles={"1g.10gb": 1, "3g.40gb": 1})
    b = Usage(gpus=2, mig_compute_slices=1, mig_profiles={"1g.10gb": 1})
    assert minus(a, b) == Usage(mig_compute_slices=2, mig_profiles={"3g.40gb": 1})
    assert minus(b, b) == NOTHING
