from __future__ import annotations

import pytest

from fleet.allocations.states import DeploymentStatus, deployment_status


@pytest.mark.parametrize(
    ("wanted", "placed", "running", "runtime", "fits_now", "expected"),
    [
        (3, 1, 1, "container", True, DeploymentStatus.UNPLACED),
        (3, 0, 0, "container", False, DeploymentStatus.WAITING),
        (3, 3, 2, "container", False, DeploymentStatus.PLACED),
        (3, 3, 3, "container", False, DeploymentStatus.RUNNING),
        (2, 2, 0, "none", False, DeploymentStatus.PLACED),  # nothing runs: reserved slices
        (2, 3, 3, "process", False, DeploymentStatus.RUNNING),  # scaled down, not stopped yet
        (0, 0, 0, "process", False, DeploymentStatus.PLACED),  # scaled to zero
    ],
)
def test_a_deployment_has_one_status_from_its_replicas_and_what_fits_now(
    wanted, placed, running, runtime, fits_now, expected
):
    status = deployment_status(
        wanted=wanted, placed=placed, running=running, runtime=runtime, fits_now=fits_now
    )
    assert status == expected


def test_the_status_labels_say_what_to_do():
    assert DeploymentStatus.UNPLACED.label == "unplaced, fits now"
    assert DeploymentStatus.WAITING.label == "waiting, no capacity"
