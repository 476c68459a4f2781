"""The pure sharing rules: a team's cap and guaranteed share from its deserved share and limit,
the verdict on one more replica (refused, guaranteed or borrowed), and what a team's deserved
share needs now."""

from __future__ import annotations

from fleet.placement.quota import Quota, Usage
from fleet.placement.sharing import Sharing, deserved_need, sharing_verdict

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
