"""The pure parts of what-would-it-take: ranking, the smallest quota change, and the fewest
releases after which a replica fits."""

from __future__ import annotations

from fleet.placement import rank
from fleet.placement.quota import Quota, Usage
from fleet.placement.sharing import Sharing, sharing_verdict
from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState, WholeGpuRequest
from fleet.placement.wit import (
    ApiRequest,
    Plan,
    Release,
    fewest_releases,
    quota_change,
    rank_plans,
    with_prefix,
)

PUT = ApiRequest("PUT", "/teams/1/quota", {"gpus": 2})


def test_stopping_anyone_ranks_below_any_number_of_moves():
    stop = Plan("stop", "stop one", stopped=1)
    moves = Plan("moves", "move three", moved=3)
    assert rank_plans([stop, moves]) == [moves, stop]


def test_fewer_moves_first_then_no_policy_change_then_fewer_reshapes():
    two = Plan("moves", "two", moved=2)
    one = Plan("moves", "one", moved=1)
    quota = Plan("quota", "quota", changes_policy=True)
    reshape = Plan("reshape", "reshape one", reshaped=1)
    reshape_two = Plan("reshape", "reshape two", reshaped=2)
    assert rank_plans([quota, two, reshape_two, one, reshape]) == [
        reshape,
        reshape_two,
        quota,
        one,
        two,
    ]


def test_waiting_is_always_last_and_placing_now_first():
    wait = Plan("wait", "wait")
    place = Plan("place", "place")
    stop = Plan("stop", "stop", stopped=5)
    assert rank_plans([wait, stop, place]) == [place, stop, wait]


def test_a_quota_prefix_makes_the_plan_an_admins_and_a_policy_change():
    moves = Plan("moves", "Move 1.", (ApiRequest("POST", "/deployments/3/defrag"),), moved=1)
    moves = Plan(**{**moves.__dict__, "role": "operator"})
    prefixed = with_prefix(moves, (PUT,), "admin", "Raise;")
    assert prefixed.requests[0] == PUT and prefixed.role == "admin" and prefixed.changes_policy
    assert rank_plans([prefixed, moves]) == [moves, prefixed]


def test_a_hard_cap_is_raised_to_what_the_team_would_hold():
    sharing = Sharing(deserved=Quota(gpus=1))
    change = quota_change(sharing, Usage(gpus=1), Usage(gpus=2), Usage(), Usage())
    assert change is not None
    assert change.body == {"gpus": 3} and not change.borrowed
    assert change.raised == (("deserved", "gpus", 1, 3),)


def test_a_limit_alone_is_raised_when_borrowing_then_is_allowed():
    sharing = Sharing(deserved=Quota(gpus=1), limit=Quota(gpus=2))
    change = quota_change(sharing, Usage(gpus=2), Usage(gpus=1), Usage(gpus=4), Usage())
    assert change is not None
    assert change.body == {"limit": {"gpus": 3}} and change.borrowed


def test_the_deserved_share_is_raised_when_borrowing_is_refused():
    sharing = Sharing(deserved=Quota(gpus=1), limit=Quota(gpus=4))
    free, others = Usage(gpus=1), Usage(gpus=1)  # the one free GPU is another team's due
    assert not sharing_verdict(sharing, Usage(gpus=1), Usage(gpus=1), free, others).allowed
    change = quota_change(sharing, Usage(gpus=1), Usage(gpus=1), free, others)
    assert change is not None
    assert change.body == {"gpus": 2} and not change.borrowed


def test_a_mig_profile_limit_is_sent_whole():
    sharing = Sharing(deserved=Quota(mig_profiles={"1g.10gb": 1, "3g.40gb": 2}))
    demand = Usage(mig_compute_slices=1, mig_profiles={"1g.10gb": 1})
    change = quota_change(
        sharing, Usage(mig_compute_slices=1, mig_profiles={"1g.10gb": 1}), demand, Usage(), Usage()
    )
    assert change is not None
    assert change.body == {"mig_profiles": {"1g.10gb": 2, "3g.40gb": 2}}


def test_no_change_when_the_quota_admits_it():
    assert quota_change(Sharing(), Usage(), Usage(gpus=1), Usage(), Usage()) is None


def _fleet(taken: list[bool]) -> FleetSnapshot:
    host = HostState(1)
    gpus = tuple(GpuState(i + 1, 1, "h100-sxm5-80gb", 81559, taken=t) for i, t in enumerate(taken))
    return FleetSnapshot((host,), gpus)


def _fits(count: int):
    return lambda s: rank(s, WholeGpuRequest(count)).best is not None


def test_the_fewest_releases_soonest_first():
    snapshot = _fleet([True, True, True])
    releases = [
        Release(("gpu", 3), 3, None, "late"),
        Release(("gpu", 1), 1, 50.0, "second"),
        Release(("gpu", 2), 2, 10.0, "first"),
    ]
    one = fewest_releases(releases, _fits(1), snapshot)
    assert one is not None and [r.what for r in one] == ["first"]
    two = fewest_releases(releases, _fits(2), snapshot)
    assert two is not None and [r.what for r in two] == ["first", "second"]
    assert fewest_releases(releases, _fits(4), snapshot) is None
    assert fewest_releases([], _fits(1), snapshot) is None
