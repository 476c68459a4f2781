"""Rule ``placement.host_labels``: a replica goes only to a host carrying every label its
deployment requires."""

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
ZONE_B = Demand(host_labels=(("zone", "b"),))


def two_hosts(mode: str, first: dict[str, str], second: dict[str, str]) -> FleetSnapshot:
    """Two hosts alike but for their labels, one GPU each, in the same state."""
    return FleetSnapshot(
        (
            HostState(1, name="gpu-a", labels=tuple(sorted(first.items()))),
            HostState(2, name="gpu-b", labels=tuple(sorted(second.items()))),
        ),
        (GpuState(1, 1, H100, MEM, mode), GpuState(2, 2, H100, MEM, mode)),  # type: ignore[arg-type]
    )


REQUESTS: list[tuple[str, PlacementRequest]] = [
    ("mig", MigRequest("1g.10gb")),
    ("mps", MpsRequest(4096)),
    ("dedicated", WholeGpuRequest(1)),
]


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_replica_is_refused_on_a_host_without_its_required_label(
    mode, request_, strategy
) -> None:
    snapshot = two_hosts(mode, {"zone": "a"}, {"zone": "b", "rack": "7"})

    ranking = rank(snapshot, request_, strategy=strategy, demand=ZONE_B)

    assert {t.gpu_id for t in ranking.feasible} == {2}
    refusal = ranking.verdict(1)
    assert isinstance(refusal, Refusal)
    (violation,) = refusal.violations
    assert violation.code == "placement.host_labels"
    assert violation.message == (
        "gpu-a does not carry the label(s) this deployment requires: zone=b."
    )
    assert violation.details == {
        "missing": {"zone": "b"},
        "required": {"zone": "b"},
        "labels": {"zone": "a"},
    }


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_check_refuses_the_commit_with_the_same_code(mode, request_) -> None:
    snapshot = two_hosts(mode, {}, {"zone": "b"})

    refused = check(snapshot, request_, gpu_id=1, demand=ZONE_B)
    accepted = check(snapshot, request_, gpu_id=2, demand=ZONE_B)

    assert isinstance(refused, Refusal)
    assert [v.code for v in refused.violations] == ["placement.host_labels"]
    assert isinstance(accepted, Target)


def test_every_required_label_must_match_its_value() -> None:
    snapshot = two_hosts("mps", {"zone": "b", "gpu": "h100"}, {"zone": "b"})
    both = Demand(host_labels=(("gpu", "h100"), ("zone", "b")))

    ranking = rank(snapshot, MpsRequest(4096), demand=both)

    assert [t.gpu_id for t in ranking.feasible] == [1]
    refusal = ranking.verdict(2)
    assert isinstance(refusal, Refusal)
    assert refusal.violations[0].details["missing"] == {"gpu": "h100"}


def test_without_required_labels_any_host_takes_the_replica() -> None:
    snapshot = two_hosts("mps", {}, {"zone": "b"})

    assert len(rank(snapshot, MpsRequest(4096)).feasible) == 2
    assert len(rank(snapshot, MpsRequest(4096), demand=Demand()).feasible) == 2


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_the_engines_memo_keeps_answers_for_different_labels_apart(mode, request_) -> None:
    # Both hosts are in the same state: the product strategy memoises each host's answer per
    # request and demand; a required label must not leak across.
    snapshot = two_hosts(mode, {"zone": "a"}, {"zone": "b"})
    zone_a = Demand(host_labels=(("zone", "a"),))

    free = rank(snapshot, request_).best
    in_b = rank(snapshot, request_, demand=ZONE_B).best
    in_a = rank(snapshot, request_, demand=zone_a).best
    again = rank(snapshot, request_, demand=ZONE_B).best

    assert free is not None and free.gpu_id == 1
    assert in_b is not None and in_b.gpu_id == 2
    assert in_a is not None and in_a.gpu_id == 1
    assert again == in_b


def test_nothing_fits_when_no_host_carries_the_labels() -> None:
    snapshot = two_hosts("mig", {"zone": "a"}, {})

    ranking = rank(snapshot, MigRequest("1g.10gb"), demand=ZONE_B)

    assert ranking.best is None
    codes = {v.code for r in ranking.infeasible for v in r.violations}
    assert codes == {"placement.host_labels"}
