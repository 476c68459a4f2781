"""Rule ``placement.host_reserved``: a host reserved for some teams takes only replicas of their
deployments; a host without a reservation takes every team's."""

from __future__ import annotations

import pytest

from fleet.mps import MpsRequest
from fleet.placement.fit import STRATEGIES, Refusal, Target, check, rank
from fleet.placement.snapshot import (
    Demand,
    FleetSnapshot,
    GpuState,
    HostState,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

H100 = "h100-sxm5-80gb"
MEM = 81559
SEARCH, ADS = 3, 4
OF_SEARCH = Demand(team=SEARCH)
OF_ADS = Demand(team=ADS)


def two_hosts(mode: str, reserved: tuple[tuple[int, str], ...]) -> FleetSnapshot:
    """Two hosts alike, one GPU each in the same state; the first is reserved (or not)."""
    return FleetSnapshot(
        (HostState(1, name="gpu-a", reserved_for=reserved), HostState(2, name="gpu-b")),
        (GpuState(1, 1, H100, MEM, mode), GpuState(2, 2, H100, MEM, mode)),  # type: ignore[arg-type]
    )


REQUESTS: list[tuple[str, PlacementRequest]] = [
    ("mig", MigRequest("1g.10gb")),
    ("mps", MpsRequest(4096)),
    ("dedicated", WholeGpuRequest(1)),
]


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_replica_of_another_team_is_refused_on_a_reserved_host(mode, request_, strategy):
    snapshot = two_hosts(mode, ((SEARCH, "search"),))

    ranking = rank(snapshot, request_, strategy=strategy, demand=OF_ADS)

    assert {t.gpu_id for t in ranking.feasible} == {2}
    refusal = ranking.verdict(1)
    assert isinstance(refusal, Refusal)
    (violation,) = refusal.violations
    assert violation.code == "placement.host_reserved"
    assert violation.message == (
        "gpu-a is reserved for team(s) search: it takes only their deployments' replicas."
    )
    assert violation.details == {"host": 1, "reserved_for": ["search"], "team": ADS}


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_replica_of_a_team_it_is_reserved_for_is_taken(mode, request_, strategy):
    snapshot = two_hosts(mode, ((SEARCH, "search"), (7, "web")))

    ranking = rank(snapshot, request_, strategy=strategy, demand=OF_SEARCH)

    assert {t.gpu_id for t in ranking.feasible} == {1, 2}


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_check_refuses_the_commit_with_the_same_code(mode, request_):
    snapshot = two_hosts(mode, ((SEARCH, "search"),))

    refused = check(snapshot, request_, gpu_id=1, demand=OF_ADS)
    accepted = check(snapshot, request_, gpu_id=1, demand=OF_SEARCH)

    assert isinstance(refused, Refusal)
    assert [v.code for v in refused.violations] == ["placement.host_reserved"]
    assert isinstance(accepted, Target)


def test_a_host_without_a_reservation_takes_every_team_and_no_team():
    snapshot = two_hosts("mps", ())

    for demand in (OF_SEARCH, OF_ADS, Demand(), None):
        assert len(rank(snapshot, MpsRequest(4096), demand=demand).feasible) == 2


def test_a_demand_without_a_team_is_refused_but_no_demand_asks_nothing():
    # The product always names the team; ``None`` (free capacity, benchmarks) asks nothing.
    snapshot = two_hosts("mps", ((SEARCH, "search"),))

    assert [t.gpu_id for t in rank(snapshot, MpsRequest(4096), demand=Demand()).feasible] == [2]
    assert len(rank(snapshot, MpsRequest(4096)).feasible) == 2


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_the_engines_memo_keeps_answers_for_different_teams_apart(mode, request_):
    # The product strategy memoises each host's answer per request and demand: a team's answer
    # must not leak to another's.
    snapshot = two_hosts(mode, ((SEARCH, "search"),))

    mine = rank(snapshot, request_, demand=OF_SEARCH).best
    theirs = rank(snapshot, request_, demand=OF_ADS).best
    again = rank(snapshot, request_, demand=OF_SEARCH).best

    assert mine is not None and mine.gpu_id == 1
    assert theirs is not None and theirs.gpu_id == 2
    assert again == mine


def test_nothing_fits_when_every_host_is_reserved_for_other_teams():
    snapshot = FleetSnapshot(
        (HostState(1, name="gpu-a", reserved_for=((SEARCH, "search"),)),),
        (GpuState(1, 1, H100, MEM, "mps"),),
    )

    ranking = rank(snapshot, MpsRequest(4096), demand=OF_ADS)

    assert ranking.best is None
    assert [v.code for r in ranking.infeasible for v in r.violations] == ["placement.host_reserved"]
