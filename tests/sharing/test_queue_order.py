"""The queue's pure ordering: priority first, then each team's weighted share of decayed use,
then the longest waiting; the decay halves a use every half-life."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.placement.fairshare import (
    UseInterval,
    Waiting,
    decayed_use,
    queue_order,
    team_shares,
)

DAY = 86400.0
WEEK = 7 * DAY


def test_a_use_one_half_life_ago_counts_half_of_a_use_now():
    recent = decayed_use(UseInterval(1, WEEK - 60, WEEK, 1.0), WEEK, WEEK)
    older = decayed_use(UseInterval(1, -60, 0, 1.0), WEEK, WEEK)
    assert recent == pytest.approx(60, rel=1e-3)
    assert older == pytest.approx(recent / 2, rel=1e-3)


def test_an_open_interval_counts_until_now_and_the_future_not_at_all():
    open_ = decayed_use(UseInterval(1, 0, None, 2.0), 100, WEEK)
    assert open_ == pytest.approx(200, rel=1e-3)
    assert decayed_use(UseInterval(1, 200, 300, 2.0), 100, WEEK) == 0


def test_holding_the_whole_fleet_forever_is_a_share_of_one_and_a_weight_divides_it():
    forever = [UseInterval(7, -1000 * WEEK, None, 4.0)]
    shares = team_shares(forever, now_s=0, half_life_s=WEEK, capacity_gpu_eq=4, weights={})
    assert shares[7] == pytest.approx(1.0, rel=1e-6)
    weighted = team_shares(forever, now_s=0, half_life_s=WEEK, capacity_gpu_eq=4, weights={7: 2})
    assert weighted[7] == pytest.approx(0.5, rel=1e-6)


def test_a_higher_priority_goes_first_whatever_its_teams_share():
    heavy, light = 1, 2
    queue = queue_order(
        [Waiting(10, 0, light, 100, 0.0), Waiting(20, 0, heavy, 1000, 50.0)],
        {heavy: 0.9, light: 0.0},
    )
    assert [(q.waiting.deployment_id, q.position) for q in queue] == [(20, 1), (10, 2)]


def test_within_a_priority_the_team_that_used_less_goes_first():
    now = 10 * DAY
    history = [
        UseInterval(1, now - 2 * DAY, now - DAY, 8.0),  # team 1 held 8 GPUs for a day
        UseInterval(2, now - 2 * DAY, now - DAY, 2.0),  # team 2 held 2
    ]
    shares = team_shares(history, now_s=now, half_life_s=WEEK, capacity_gpu_eq=10, weights={})
    queue = queue_order([Waiting(1, 0, 1, 500, 0.0), Waiting(2, 0, 2, 500, 100.0)], shares)
    assert [q.waiting.team_id for q in queue] == [2, 1]
    assert queue[0].team_share < queue[1].team_share


def test_the_over_quota_weight_lets_a_heavier_team_ahead():
    history = [UseInterval(1, 0, DAY, 6.0), UseInterval(2, 0, DAY, 4.0)]
    shares = team_shares(history, now_s=DAY, half_life_s=WEEK, capacity_gpu_eq=10, weights={1: 3})
    queue = queue_order([Waiting(5, 0, 2, 0, 0.0), Waiting(6, 0, 1, 0, 0.0)], shares)
    assert [q.waiting.team_id for q in queue] == [1, 2]


def test_an_old_use_fades_so_a_team_that_was_heavy_long_ago_goes_first():
    now = 60 * DAY
    history = [
        UseInterval(1, 0, DAY, 10.0),  # heavy, two months ago
        UseInterval(2, now - DAY, now, 2.0),  # light, yesterday
    ]
    shares = team_shares(history, now_s=now, half_life_s=WEEK, capacity_gpu_eq=10, weights={})
    assert shares[1] < shares[2]


def test_ties_go_to_the_longest_waiting_then_by_deployment_and_replica():
    queue = queue_order(
        [Waiting(3, 1, 1, 0, 5.0), Waiting(3, 0, 1, 0, 5.0), Waiting(2, 0, 1, 0, 9.0)], {}
    )
    assert [(q.waiting.deployment_id, q.waiting.replica) for q in queue] == [(3, 0), (3, 1), (2, 0)]


waitings = st.lists(
    st.builds(
        Waiting,
        deployment_id=st.integers(1, 50),
        replica=st.integers(0, 5),
        team_id=st.integers(1, 4),
        priority=st.sampled_from([100, 500, 1000]),
        waiting_since_s=st.floats(0, 1e6),
    ),
    max_size=30,
)


@given(waitings, st.dictionaries(st.integers(1, 4), st.floats(0, 1)))
def test_the_queue_is_a_permutation_by_priority_then_share(waiting, shares):
    queue = queue_order(waiting, shares)
    assert sorted(q.position for q in queue) == list(range(1, len(waiting) + 1))
    assert sorted(map(id, (q.waiting for q in queue))) == sorted(map(id, waiting))
    for ahead, behind in itertools.pairwise(queue):
        a, b = ahead.waiting, behind.waiting
        assert a.priority >= b.priority
        if a.priority == b.priority:
            assert ahead.team_share <= behind.team_share or math.isclose(
                ahead.team_share, behind.team_share
            )
