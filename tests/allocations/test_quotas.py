"""Team quotas on every path that places a replica: place, auto-placement, scale, rolling update
(its copies are moves), moves, and a fault's re-placement, which may pass the quota but says so.

Moves: a team's first move in flight is its one surge replica (not counted); every other move's
new copy counts against the quota until its move ends. The fleet's own moves (drains) pass the
quota on the record."""

from __future__ import annotations

import pytest

from fleet.allocations.autoplace import deployment_create_placed, deployment_place_all
from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.maintenance import host_drain
from fleet.allocations.models import Allocation
from fleet.allocations.moves import allocation_move
from fleet.allocations.quotas import QuotaExceeded, quota_refusal, team_usage
from fleet.allocations.scaling import deployment_scale
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation, OperationKind
from fleet.core.teams import team_create, team_quota_set
from fleet.inventory.models import Gpu
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.placement.quota import Usage
from fleet.workflows.deployment_rollouts import deployment_rollout_advance
from fleet.workflows.health import replace_allocations
from fleet.workflows.host_drain import host_drain_advance
from fleet.workflows.moves import move_advance
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

MPS = DeploymentRequest(kind="mps", memory_mib=4096)
WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)
MIG_1G = DeploymentRequest(kind="mig", profile="1g.10gb")


@pytest.fixture
def team():
    return team_create(name="search")


def quota(team, **limits):
    team_quota_set(team_id=team.pk, quota=limits)


def whole_gpus(n, runtime="none"):
    host = HostFactory(runtime=runtime, process_runtime=runtime == "process")
    gpus = [GpuFactory(host=host) for _ in range(n)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpus


def mps_gpu():
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    return gpu


def mig_gpu(*instances):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    spec = tuple(MigInstanceSpec(profile=p, start=s) for p, s in instances)
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=spec))
    return gpu


def refused(call):
    before = snapshot_rows()
    with pytest.raises(QuotaExceeded) as caught:
        call()
    assert snapshot_rows() == before
    error = caught.value
    assert (error.code, error.status_code) == ("quota.exceeded", 422)
    return error.details


def test_whole_gpus_past_the_quota_are_refused_with_the_limit_in_use_and_requested(team):
    gpus = whole_gpus(3)
    quota(team, gpus=2)
    d = deployment_create(name="train", request=WHOLE, replicas=3, team_id=team.pk)
    deployment_place(deployment_id=d.pk, gpu_id=gpus[0].pk)
    deployment_place(deployment_id=d.pk, gpu_id=gpus[1].pk)
    details = refused(lambda: deployment_place(deployment_id=d.pk, gpu_id=gpus[2].pk))
    assert {k: details[k] for k in ("limit", "quota", "in_use", "requested", "team")} == {
        "limit": "gpus",
        "quota": 2,
        "in_use": 2,
        "requested": 1,
        "team": team.pk,
    }
    assert team_usage(team.pk) == Usage(gpus=2)


def test_mps_memory_past_the_quota_is_refused(team):
    gpu = mps_gpu()
    quota(team, mps_memory_mib=8192)
    d = deployment_create(name="asr", request=MPS, replicas=3, team_id=team.pk)
    deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
    deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
    details = refused(lambda: deployment_place(deployment_id=d.pk, gpu_id=gpu.pk))
    assert (details["limit"], details["in_use"], details["requested"]) == (
        "mps_memory_mib",
        8192,
        4096,
    )


def test_mig_compute_slices_count_the_slices_of_each_replica(team):
    gpu = mig_gpu(("3g.40gb", 4), ("1g.10gb", 0), ("1g.10gb", 1))
    quota(team, mig_compute_slices=4)
    big = deployment_create(
        name="big",
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        team_id=team.pk,
        replicas=1,
    )
    small = deployment_create(name="small", request=MIG_1G, replicas=2, team_id=team.pk)
    deployment_place(deployment_id=big.pk, gpu_id=gpu.pk)
    deployment_place(deployment_id=small.pk, gpu_id=gpu.pk)
    assert team_usage(team.pk).mig_compute_slices == 4
    details = refused(lambda: deployment_place(deployment_id=small.pk, gpu_id=gpu.pk))
    assert (details["limit"], details["in_use"], details["requested"]) == (
        "mig_compute_slices",
        4,
        1,
    )


def test_a_mig_profile_limit_bounds_that_profile_only(team):
    gpu = mig_gpu(("3g.40gb", 4), ("1g.10gb", 0), ("1g.10gb", 1))
    quota(team, mig_profiles={"1g.10gb": 1})
    small = deployment_create(name="small", request=MIG_1G, replicas=2, team_id=team.pk)
    big = deployment_create(
        name="big",
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        team_id=team.pk,
        replicas=1,
    )
    deployment_place(deployment_id=small.pk, gpu_id=gpu.pk)
    deployment_place(deployment_id=big.pk, gpu_id=gpu.pk)  # not listed: free
    details = refused(lambda: deployment_place(deployment_id=small.pk, gpu_id=gpu.pk))
    assert details["limit"] == "mig_profiles.1g.10gb"
    assert team_usage(team.pk).mig_profiles == {"1g.10gb": 1, "3g.40gb": 1}


def test_other_teams_and_the_default_team_are_not_bounded_by_a_teams_quota(team):
    gpus = whole_gpus(2)
    quota(team, gpus=0)
    free = deployment_create(name="free", request=WHOLE, replicas=1)
    deployment_place(deployment_id=free.pk, gpu_id=gpus[0].pk)
    assert team_usage(team.pk) == Usage()
    bounded = deployment_create(name="bounded", request=WHOLE, replicas=1, team_id=team.pk)
    refused(lambda: deployment_place(deployment_id=bounded.pk, gpu_id=gpus[1].pk))


def test_auto_placement_is_refused_for_the_quota_not_for_capacity(team):
    whole_gpus(3)
    quota(team, gpus=1)
    details = refused(
        lambda: deployment_create_placed(name="auto", request=WHOLE, replicas=2, team_id=team.pk)
    )
    assert details["limit"] == "gpus"


def test_place_all_keeps_what_fits_the_quota_and_says_why_the_rest_waits(team):
    whole_gpus(3)
    quota(team, gpus=2)
    d = deployment_create(name="train", request=WHOLE, replicas=3, team_id=team.pk)
    result = deployment_place_all(deployment_id=d.pk)
    assert (len(result.operations), result.unplaced) == (2, 1)
    assert result.reasons[0].code == "quota.exceeded"
    # Nothing at all fits the quota: the quota's 422, not "nothing fits".
    refused(lambda: deployment_place_all(deployment_id=d.pk))


def test_scaling_an_auto_placed_deployment_past_the_quota_changes_nothing(team):
    whole_gpus(3)
    quota(team, gpus=2)
    d = deployment_create_placed(name="train", request=WHOLE, replicas=2, team_id=team.pk)
    details = refused(lambda: deployment_scale(deployment_id=d.pk, replicas=3))
    assert details["limit"] == "gpus"
    d.refresh_from_db()
    assert d.replicas == 2


def test_a_move_at_the_quota_is_not_refused_and_its_new_copy_is_not_counted(team):
    allow_process(team)
    gpus = whole_gpus(2, runtime="process")
    quota(team, gpus=1)
    d = deployment_create(
        name="train",
        request=WHOLE,
        replicas=1,
        team_id=team.pk,
        workload={"runtime": "process", "command": ["/bin/true"]},
    )
    deployment_place(deployment_id=d.pk, gpu_id=gpus[0].pk)
    old = Allocation.objects.get(deployment=d)
    allocation_move(allocation_id=old.pk, gpu_id=gpus[1].pk)
    assert Allocation.objects.filter(deployment=d, replaces=old).exists()  # two copies now
    assert team_usage(team.pk) == Usage(gpus=1)  # the replica counts once


def test_the_drag_preview_names_the_limit_before_the_drop(team):
    gpus = whole_gpus(2)
    quota(team, gpus=1)
    d = deployment_create(name="train", request=WHOLE, replicas=2, team_id=team.pk)
    assert quota_refusal(d) == []
    deployment_place(deployment_id=d.pk, gpu_id=gpus[0].pk)
    [violation] = quota_refusal(d)
    assert (violation.code, violation.details["limit"]) == ("quota.exceeded", "gpus")


def test_a_lowered_quota_evicts_nothing_and_a_faults_re_placement_passes_it_on_the_record(team):
    gpus = whole_gpus(3)
    d = deployment_create_placed(name="train", request=WHOLE, replicas=2, team_id=team.pk)
    quota(team, gpus=1)  # below the 2 in use: taken, nothing evicted
    assert team_usage(team.pk) == Usage(gpus=2)
    sick = Allocation.objects.filter(deployment=d).first().gpu_id
    Gpu.objects.filter(pk=sick).update(cordoned=True)  # as a fault does
    [recorded] = replace_allocations(gpu_id=sick, reason="GPU fell off the bus")
    replace = Operation.objects.get(pk=recorded)
    assert replace.status == "succeeded", replace.reason
    over = Operation.objects.get(kind=OperationKind.OVER_QUOTA)
    assert "fell off the bus" in over.reason and over.payload["team"] == team.pk
    assert over.payload["violations"][0]["details"]["limit"] == "gpus"
    assert team_usage(team.pk).gpus == 2
    assert sick not in {a.gpu_id for a in Allocation.objects.placed().filter(deployment=d)}
    assert len(gpus) == 3  # one left for the re-placement


def test_a_fault_within_the_quota_records_no_over_quota(team):
    whole_gpus(2)
    quota(team, gpus=1)
    d = deployment_create_placed(name="train", request=WHOLE, replicas=1, team_id=team.pk)
    sick = Allocation.objects.get(deployment=d).gpu_id
    Gpu.objects.filter(pk=sick).update(cordoned=True)
    replace_allocations(gpu_id=sick, reason="GPU fell off the bus")
    assert not Operation.objects.filter(kind=OperationKind.OVER_QUOTA).exists()
    assert Allocation.objects.placed().get(deployment=d).gpu_id != sick


def test_webhooks_hear_when_a_team_reaches_90_and_100_percent_of_a_limit(team):
    from fleet.core.models import AlertDelivery
    from tests.factories import webhook

    webhook("http://127.0.0.1:9/hook", ["quota.warning", "quota.exceeded"])
    gpu = mps_gpu()
    quota(team, mps_memory_mib=10 * 4096)
    d = deployment_create(name="chat", request=MPS, replicas=10, team_id=team.pk)
    for placed in range(1, 11):
        deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
        events = list(AlertDelivery.objects.order_by("pk").values_list("event", flat=True))
        # 9 of 10 shares: 90 %, a warning; 10 of 10: full, the next one is refused.
        expected = ["quota.warning"] * (placed >= 9) + ["quota.exceeded"] * (placed >= 10)
        assert events == expected, (placed, events)
    payload = AlertDelivery.objects.get(event="quota.exceeded").payload
    assert payload["subject"] == {
        "team": {"id": team.pk, "name": "search"},
        "limit": "mps_memory_mib",
        "share": 1.0,
    }


PROCESS = {"runtime": "process", "command": ["/opt/serve"]}


def team_at_quota(team, *, gpus: int, quota_gpus: int, replicas: int, placed: int | None = None):
    """A team's deployment of whole-GPU process replicas (their moves wait for the new copy to
    run) on one host of ``gpus`` GPUs, the first ``placed`` (default: all) in place."""
    allow_process(team)
    host_gpus = whole_gpus(gpus, runtime="process")
    quota(team, gpus=quota_gpus)
    d = deployment_create(
        name="train", request=WHOLE, replicas=replicas, team_id=team.pk, workload=PROCESS
    )
    for gpu in host_gpus[: replicas if placed is None else placed]:
        deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
    return d, host_gpus, list(Allocation.objects.filter(deployment=d).order_by("replica"))


def finish(move) -> None:
    """The move's new copy runs: the move ends (its old copy stops)."""
    Allocation.objects.filter(pk=move.payload["to_allocation"]).update(workload_state="running")
    assert move_advance(operation_id=move.pk) == "done"


def test_a_team_at_its_quota_moves_one_replica_and_a_second_move_waits_for_it(team):
    d, gpus, olds = team_at_quota(team, gpus=4, quota_gpus=2, replicas=2)

    first = allocation_move(allocation_id=olds[0].pk, gpu_id=gpus[2].pk)
    assert first.status == "dispatched"  # the team's surge replica: not counted
    assert team_usage(team.pk) == Usage(gpus=2)

    details = refused(lambda: allocation_move(allocation_id=olds[1].pk, gpu_id=gpus[3].pk))
    assert {k: details[k] for k in ("limit", "quota", "in_use", "requested", "team")} == {
        "limit": "gpus",
        "quota": 2,
        "in_use": 2,
        "requested": 1,
        "team": team.pk,
    }
    assert details["surge_in_use"] is True
    assert details["moving"] == [{"deployment": d.pk, "replica": 0, "operation": first.pk}]

    finish(first)
    second = allocation_move(allocation_id=olds[1].pk, gpu_id=gpus[3].pk)
    assert second.status == "dispatched"
    assert team_usage(team.pk) == Usage(gpus=2)
    assert not Operation.objects.filter(kind=OperationKind.OVER_QUOTA).exists()


def test_the_refusal_says_the_surge_is_in_use_through_the_api(team, operator_client):
    _, gpus, olds = team_at_quota(team, gpus=4, quota_gpus=2, replicas=2)
    first = operator_client.post(
        f"/api/v1/allocations/{olds[0].pk}/move", {"gpu": gpus[2].pk}, format="json"
    )
    assert first.status_code == 202, first.json()

    before = snapshot_rows()
    second = operator_client.post(
        f"/api/v1/allocations/{olds[1].pk}/move", {"gpu": gpus[3].pk}, format="json"
    )
    body = assert_error(second, 422, "quota.exceeded")
    assert body["details"]["surge_in_use"] is True
    assert "surge replica is in use by the move of train[0]" in body["message"]
    assert snapshot_rows() == before


def test_with_headroom_moves_run_while_their_new_copies_fit_the_quota(team):
    d, gpus, olds = team_at_quota(team, gpus=5, quota_gpus=3, replicas=3, placed=2)

    allocation_move(allocation_id=olds[0].pk, gpu_id=gpus[2].pk)  # the surge
    allocation_move(allocation_id=olds[1].pk, gpu_id=gpus[3].pk)  # counted: 2 + 1 of 3
    assert team_usage(team.pk) == Usage(gpus=3)

    # The counted copy holds the team's headroom: a new replica must wait too.
    details = refused(lambda: deployment_place(deployment_id=d.pk, gpu_id=gpus[4].pk))
    assert (details["limit"], details["in_use"]) == ("gpus", 3)


def test_a_host_drain_moves_past_the_quota_on_the_record(team):
    """The team's surge replica is in use by its own move; the fleet's drain still moves its
    other replica, recorded as an ``over_quota`` operation."""
    allow_process(team)
    quota(team, gpus=2)
    (drained,) = whole_gpus(1, runtime="process")
    others = whole_gpus(3, runtime="process")
    d = deployment_create(
        name="train", request=WHOLE, replicas=2, team_id=team.pk, workload=PROCESS
    )
    deployment_place(deployment_id=d.pk, gpu_id=drained.pk)
    deployment_place(deployment_id=d.pk, gpu_id=others[0].pk)
    on_drained, elsewhere = (
        Allocation.objects.get(deployment=d, gpu=g) for g in (drained, others[0])
    )
    allocation_move(allocation_id=elsewhere.pk, gpu_id=others[1].pk)  # the team's own move

    drain = host_drain(host_id=drained.host_id)
    assert host_drain_advance(operation_id=drain.pk) == "wait"

    moved = Allocation.objects.get(replaces=on_drained)
    assert moved.gpu_id == others[2].pk
    over = Operation.objects.get(kind=OperationKind.OVER_QUOTA)
    assert f"draining host {drained.host.name}" in over.reason
    assert over.payload["violations"][0]["details"]["limit"] == "gpus"
    assert "moved over team search's quota" in over.summary


def test_a_rolling_update_at_the_quota_surges_one_replica_at_a_time(team, settings):
    settings.FLEET_ROLLOUT_MIN_READY_SECONDS = 0
    d, _, olds = team_at_quota(team, gpus=4, quota_gpus=2, replicas=2)
    rollout = deployment_rollout_start(
        deployment_id=d.pk, workload={**PROCESS, "command": ["/opt/serve", "--v2"]}, max_surge=2
    )

    assert deployment_rollout_advance(operation_id=rollout.pk) == "wait"
    (first,) = Allocation.objects.filter(deployment=d, replaces__isnull=False)
    rollout.refresh_from_db()
    assert "surge replica is in use" in rollout.payload["waiting_for"]
    assert rollout.payload["pending"] == [1]  # waits, does not fail

    finish(Operation.objects.get(kind=OperationKind.MOVE, payload__to_allocation=first.pk))
    deployment_rollout_advance(operation_id=rollout.pk)
    (second,) = Allocation.objects.filter(deployment=d, replaces__isnull=False)
    assert second.replica == 1
    finish(Operation.objects.get(kind=OperationKind.MOVE, payload__to_allocation=second.pk))
    assert deployment_rollout_advance(operation_id=rollout.pk) == "done"
    rollout.refresh_from_db()
    assert rollout.status == "succeeded", rollout.payload
    placed = Allocation.objects.placed().filter(deployment=d)
    assert sorted(placed.values_list("pk", flat=True)) == [first.pk, second.pk]
    assert not placed.filter(pk__in=[a.pk for a in olds]).exists()
