"""Rule ``placement.port_in_use``: a workload that listens on a port of its host's network
(containers and processes run there) takes one host per copy; a second copy on the same host
could not bind the port."""

from __future__ import annotations

import pytest

from fleet.mps import MpsRequest
from fleet.placement.fit import STRATEGIES, Refusal, Target, check, rank
from fleet.placement.snapshot import Demand, MigRequest, PlacementRequest, WholeGpuRequest
from tests.placement.test_host_labels import two_hosts

ON_HOST_1 = Demand(
    runtimes=("container",), workload="container", port=8080, avoid_hosts=frozenset({1})
)

REQUESTS: list[tuple[str, PlacementRequest]] = [
    ("mig", MigRequest("1g.10gb")),
    ("mps", MpsRequest(4096)),
    ("dedicated", WholeGpuRequest(1)),
]


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_copy_goes_to_a_host_that_does_not_run_one_yet(mode, request_, strategy) -> None:
    snapshot = two_hosts(mode, {}, {})
    free = rank(snapshot, request_, strategy=strategy, demand=None)
    assert {t.gpu_id for t in free.feasible} == {1, 2}  # the memo learns both hosts take it

    ranking = rank(snapshot, request_, strategy=strategy, demand=ON_HOST_1)

    assert {t.gpu_id for t in ranking.feasible} == {2}
    assert ranking.best is not None and ranking.best.gpu_id == 2
    refusal = ranking.verdict(1)
    assert isinstance(refusal, Refusal)
    (violation,) = refusal.violations
    assert violation.code == "placement.port_in_use"
    assert "port 8080" in violation.message and violation.details == {"port": 8080, "host": 1}


@pytest.mark.parametrize(("mode", "request_"), REQUESTS)
def test_check_refuses_the_commit_on_that_host(mode, request_) -> None:
    snapshot = two_hosts(mode, {}, {})
    refused = check(snapshot, request_, gpu_id=1, demand=ON_HOST_1)
    assert isinstance(refused, Refusal)
    assert [v.code for v in refused.violations] == ["placement.port_in_use"]
    assert isinstance(check(snapshot, request_, gpu_id=2, demand=ON_HOST_1), Target)
