"""Team quotas in the pure domain: what one replica asks of each limit, and which limits a new
replica breaks (each kind alone, several at once, and the edges)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.placement import MigRequest, MpsRequest, WholeGpuRequest
from fleet.placement.quota import (
    Quota,
    Usage,
    compute_slices_of,
    covers,
    profile_key,
    quota_violations,
    replica_demand,
)


@pytest.mark.parametrize(
    ("profile", "slices"),
    [("1g.10gb", 1), ("3g.40gb", 3), ("7g.80gb", 7), ("1g.10gb+me", 1), ("mig-4g.71gb", 4)],
)
def test_a_mig_profile_takes_the_compute_slices_its_name_says(profile, slices):
    assert compute_slices_of(profile) == slices


def test_a_profile_without_a_name_takes_no_compute_slices():
    assert compute_slices_of(19) == 0


def test_profile_limits_are_keyed_without_the_mig_prefix():
    assert profile_key("mig-1g.10gb") == profile_key("1g.10gb") == "1g.10gb"


@pytest.mark.parametrize(
    ("request_", "demand"),
    [
        (WholeGpuRequest(2), Usage(gpus=2)),
        (MpsRequest(4096, 30), Usage(mps_memory_mib=4096)),
        (MigRequest("3g.40gb"), Usage(mig_compute_slices=3, mig_profiles={"3g.40gb": 1})),
    ],
)
def test_each_request_kind_asks_only_its_own_limit(request_, demand):
    assert replica_demand(request_) == demand


def _limits(violations):
    return [(v.code, v.details["limit"]) for v in violations]


@pytest.mark.parametrize(
    ("quota", "in_use", "asked", "broken"),
    [
        # whole GPUs
        (Quota(gpus=4), Usage(gpus=2), Usage(gpus=2), []),
        (Quota(gpus=4), Usage(gpus=3), Usage(gpus=2), ["gpus"]),
        # MIG compute slices
        (
            Quota(mig_compute_slices=14),
            Usage(mig_compute_slices=11),
            Usage(mig_compute_slices=3),
            [],
        ),
        (
            Quota(mig_compute_slices=14),
            Usage(mig_compute_slices=12),
            Usage(mig_compute_slices=3),
            ["mig_compute_slices"],
        ),
        # MPS memory
        (Quota(mps_memory_mib=65536), Usage(mps_memory_mib=61440), Usage(mps_memory_mib=4096), []),
        (
            Quota(mps_memory_mib=65536),
            Usage(mps_memory_mib=61441),
            Usage(mps_memory_mib=4096),
            ["mps_memory_mib"],
        ),
        # MIG profiles: only the listed profile is bounded
        (
            Quota(mig_profiles={"1g.10gb": 8}),
            Usage(mig_profiles={"1g.10gb": 7}),
            Usage(mig_profiles={"1g.10gb": 1}),
            [],
        ),
        (
            Quota(mig_profiles={"1g.10gb": 8}),
            Usage(mig_profiles={"1g.10gb": 8}),
            Usage(mig_profiles={"1g.10gb": 1}),
            ["mig_profiles.1g.10gb"],
        ),
        (
            Quota(mig_profiles={"1g.10gb": 0}),
            Usage(mig_profiles={"3g.40gb": 50}),
            Usage(mig_profiles={"3g.40gb": 1}),
            [],
        ),
        # a zero limit refuses the first replica
        (Quota(gpus=0), Usage(), Usage(gpus=1), ["gpus"]),
    ],
)
def test_a_replica_breaks_exactly_the_limits_it_would_pass(quota, in_use, asked, broken):
    assert _limits(quota_violations(quota, in_use, asked)) == [
        ("quota.exceeded", b) for b in broken
    ]


def test_a_refusal_names_the_limit_what_is_in_use_and_what_is_asked():
    [violation] = quota_violations(Quota(gpus=4), Usage(gpus=3), Usage(gpus=2))
    assert violation.details == {"limit": "gpus", "quota": 4, "in_use": 3, "requested": 2}
    assert "4" in violation.message and "3 in use" in violation.message


def test_a_mig_replica_can_break_its_profile_and_the_compute_slices_at_once():
    quota = Quota(mig_compute_slices=3, mig_profiles={"3g.40gb": 1})
    in_use = Usage(mig_compute_slices=3, mig_profiles={"3g.40gb": 1})
    asked = replica_demand(MigRequest("3g.40gb"))
    assert [v.details["limit"] for v in quota_violations(quota, in_use, asked)] == [
        "mig_compute_slices",
        "mig_profiles.3g.40gb",
    ]


def test_a_team_over_one_limit_may_still_place_what_asks_nothing_of_it():
    # The GPU limit was lowered below what the team holds; an MPS replica asks no GPU.
    quota = Quota(gpus=1, mps_memory_mib=8192)
    in_use = Usage(gpus=3)
    assert quota_violations(quota, in_use, replica_demand(MpsRequest(4096))) == []


def test_no_limit_bounds_nothing():
    assert not Quota().bounded
    assert quota_violations(Quota(), Usage(gpus=10**6), Usage(gpus=10**6)) == []
    assert Quota(mig_profiles={"1g.10gb": 1}).bounded


def test_covers_asks_for_at_least_every_kind_and_profile():
    three = replica_demand(MigRequest("3g.40gb"))
    one = replica_demand(MigRequest("1g.10gb"))
    assert covers(three, three)
    assert not covers(three, one)  # more slices, but not the 1g.10gb profile
    assert not covers(one, three)
    assert covers(Usage(gpus=2), Usage(gpus=1)) and not covers(Usage(gpus=1), Usage(gpus=2))
    assert covers(Usage(mps_memory_mib=10), Usage()) and not covers(Usage(), Usage(gpus=1))


_usage = st.builds(
    Usage,
    gpus=st.integers(0, 4),
    mig_compute_slices=st.integers(0, 8),
    mps_memory_mib=st.integers(0, 4),
    mig_profiles=st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(0, 3)),
)


@given(
    _usage,
    _usage,
    st.builds(Quota, gpus=st.integers(0, 6), mig_compute_slices=st.integers(0, 12)),
    _usage,
)
def test_a_demand_covering_a_refused_one_is_refused_too(asked, refused, quota, in_use):
    # What lets the queue skip a team's larger replicas once a smaller one was refused.
    if covers(asked, refused) and quota_violations(quota, in_use, refused):
        assert quota_violations(quota, in_use, asked)


_quota = st.builds(
    Quota,
    gpus=st.none() | st.integers(0, 6),
    mig_compute_slices=st.none() | st.integers(0, 12),
)


@given(_usage, _usage, _quota, _quota, _usage, _usage, _usage)
def test_borrowing_refuses_a_demand_covering_a_refused_one_too(
    asked, refused, deserved, limit, in_use, free, others_need
):
    from fleet.placement.sharing import Sharing, sharing_verdict

    sharing = Sharing(deserved=deserved, limit=limit)
    if (
        covers(asked, refused)
        and not sharing_verdict(sharing, in_use, refused, free, others_need).allowed
    ):
        assert not sharing_verdict(sharing, in_use, asked, free, others_need).allowed
