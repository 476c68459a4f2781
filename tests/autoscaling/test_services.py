"""Autoscaling on the database (issue 24): a policy set and checked; an evaluation that scales
out on the balancer's request rate and places the new replicas with the engine; the team's
quota refusing a scale-out (the count stays, an operation says why); and a scale-in that stops
the replica whose removal frees a whole GPU, not the newest, keeping the indices consecutive."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.allocations.models import Allocation, AllocationState, Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.autoscaling.models import ScalingPolicy, ScalingState
from fleet.autoscaling.policy import as_spec, autoscaling_set
from fleet.autoscaling.services import autoscale_all, autoscale_evaluate
from fleet.core.errors import ServiceError
from fleet.core.models import Operation, OperationKind, OperationStatus, default_team_id
from fleet.core.teams import team_quota_set
from fleet.endpoints.metering import Sample
from fleet.endpoints.services import endpoint_set
from fleet.endpoints.traffic import traffic_record
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.allocations.test_ports import SERVER, _report
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

POLICY = {"min": 1, "max": 6, "target": {"requests_per_replica_per_s": 4}}


@pytest.fixture
def gpus():
    host = HostFactory(runtime="docker", address="10.0.0.9")
    found = []
    for index in range(3):
        gpu = GpuFactory(host=host, index=index, product_key="h100-sxm5-80gb")
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
        found.append(gpu)
    return found


def _deployment(gpus_for_replicas) -> Deployment:
    deployment = deployment_create(
        name="chat",
        request=DeploymentRequest(kind="mps", memory_mib=8192),
        replicas=len(gpus_for_replicas),
        workload=SERVER,
    )
    for gpu in gpus_for_replicas:
        deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    for n, allocation in enumerate(Allocation.objects.filter(deployment=deployment)):
        _report(allocation, {"http": 20000 + n, "metrics": 21000 + n})
    endpoint_set(deployment_id=deployment.pk, spec={"port": "http", "path_prefix": "/chat"})
    return deployment


def _set_long_ago(deployment: Deployment) -> None:
    """The policy was set an hour ago: its scale-in cooldown from creation is past."""
    ScalingPolicy.objects.filter(pk=deployment.pk).update(
        created_at=timezone.now() - timedelta(hours=1)
    )


def _traffic(deployment: Deployment, requests_per_s: float) -> None:
    slot = deployment.endpoint.slot
    traffic_record("gw", [Sample(slot, 0, "ready", requests_per_s, 0.0, 0, 0, None)])


def test_a_policy_is_checked_stored_audited_and_removed(gpus):
    deployment = _deployment([gpus[0]])
    bad = [
        ({**POLICY, "min": -1}, "min"),
        ({**POLICY, "max": 0}, "max"),
        ({**POLICY, "min": 5, "max": 2}, "max"),
        ({**POLICY, "target": {}}, "target"),
        ({**POLICY, "target": {"rps": 4}}, "target"),
        ({**POLICY, "target": {"gpu_utilization_percent": 140}}, "target"),
        ({**POLICY, "scale_in_cooldown_s": -1}, "scale_in_cooldown_s"),
        ({**POLICY, "surprise": 1}, "surprise"),
        ([], "autoscaling"),
    ]
    for spec, field in bad:
        with pytest.raises(ServiceError) as refused:
            autoscaling_set(deployment_id=deployment.pk, spec=spec)
        assert refused.value.code == "autoscaling.invalid", spec
        assert refused.value.details["field"] == field, (spec, refused.value.details)
    assert not ScalingPolicy.objects.exists()
    policy = autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    assert policy is not None
    assert as_spec(policy) == {
        **POLICY,
        "scale_out_cooldown_s": 30,
        "scale_in_cooldown_s": 300,
        "activation_timeout_s": 300,
    }
    assert Operation.objects.filter(kind=OperationKind.SET_AUTOSCALING).count() == 1
    autoscaling_set(deployment_id=deployment.pk, spec=None)
    assert not ScalingPolicy.objects.exists()


def test_a_balancer_metric_needs_an_endpoint(gpus):
    bare = deployment_create(
        name="bare", request=DeploymentRequest(kind="mps", memory_mib=4096), replicas=1
    )
    with pytest.raises(ServiceError) as refused:
        autoscaling_set(deployment_id=bare.pk, spec=POLICY)
    assert refused.value.code == "autoscaling.needs_endpoint"
    assert refused.value.status_code == 422
    spec = {**POLICY, "target": {"gpu_utilization_percent": 70}}
    assert autoscaling_set(deployment_id=bare.pk, spec=spec) is not None


def test_a_load_step_scales_out_and_the_engine_places_the_new_replicas(gpus):
    deployment = _deployment([gpus[0], gpus[0]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    _traffic(deployment, 20.0)  # 10 per ready replica against a target of 4
    decision = autoscale_evaluate(deployment_id=deployment.pk)
    assert decision is not None and (decision.action, decision.replicas) == ("out", 5)
    deployment.refresh_from_db()
    assert deployment.replicas == 5
    assert Allocation.objects.placed().filter(deployment=deployment).count() == 5
    (operation,) = Operation.objects.filter(kind=OperationKind.AUTOSCALE)
    assert operation.status == OperationStatus.SUCCEEDED
    assert operation.payload["value"] == 20.0 and operation.payload["per_replica"] == 10.0
    assert operation.payload["ready"] == 2 and len(operation.payload["placed"]) == 3
    assert "from 2 to 5" in operation.summary
    # Right after: the new replicas are starting, and the ready two alone still ask for 5.
    again = autoscale_evaluate(deployment_id=deployment.pk)
    assert again is not None and again.action == "hold"
    policy = ScalingPolicy.objects.get(pk=deployment.pk)
    assert policy.state == ScalingState.SCALING_OUT and policy.value == 10.0


def test_the_teams_quota_refuses_a_scale_out_and_an_operation_says_so(gpus):
    deployment = _deployment([gpus[0], gpus[0]])
    team_quota_set(team_id=default_team_id(), quota={"mps_memory_mib": 3 * 8192})
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    _traffic(deployment, 20.0)
    autoscale_evaluate(deployment_id=deployment.pk)
    deployment.refresh_from_db()
    assert deployment.replicas == 3  # room for one more, not three
    policy = ScalingPolicy.objects.get(pk=deployment.pk)
    assert policy.state == ScalingState.BLOCKED_QUOTA and policy.reason == "scaling blocked: quota"
    # At the quota: the next scale-out is refused, nothing changes, the operation says why.
    ScalingPolicy.objects.filter(pk=deployment.pk).update(
        last_scale_out_at=timezone.now() - timedelta(minutes=5)
    )
    for allocation in Allocation.objects.filter(deployment=deployment, workload_state=""):
        _report(allocation, {"http": 22000 + allocation.pk, "metrics": 23000 + allocation.pk})
    _traffic(deployment, 40.0)
    autoscale_evaluate(deployment_id=deployment.pk)
    deployment.refresh_from_db()
    assert deployment.replicas == 3
    refused = Operation.objects.filter(
        kind=OperationKind.AUTOSCALE, status=OperationStatus.FAILED
    ).get()
    assert refused.reason == "quota.exceeded" and refused.payload["violations"]
    assert "refused by its team's quota" in refused.summary


def test_scale_in_stops_the_replica_that_frees_a_gpu_not_the_newest(gpus):
    # Replica 0 alone on GPU 0; replicas 1 and 2 share GPU 1.
    deployment = _deployment([gpus[0], gpus[1], gpus[1]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    _set_long_ago(deployment)
    lonely = Allocation.objects.get(deployment=deployment, replica=0)
    newest = Allocation.objects.get(deployment=deployment, replica=2)
    _traffic(deployment, 7.0)  # 2.3 per replica: 2 replicas are enough
    decision = autoscale_evaluate(deployment_id=deployment.pk)
    assert decision is not None and (decision.action, decision.replicas) == ("in", 2)
    deployment.refresh_from_db()
    assert deployment.replicas == 2
    lonely.refresh_from_db()
    newest.refresh_from_db()
    assert lonely.state == AllocationState.RELEASING  # it frees GPU 0 whole
    assert newest.state != AllocationState.RELEASING and newest.replica == 0  # takes its number
    staying = Allocation.objects.placed().filter(deployment=deployment)
    assert sorted(staying.values_list("replica", flat=True)) == [0, 1]
    assert {a.gpu_id for a in staying} == {gpus[1].pk}
    operation = Operation.objects.get(kind=OperationKind.AUTOSCALE)
    assert operation.payload["stopped_replicas"] == [0]
    assert operation.payload["renumbered"] == {"2": 0}
    # Scale-in is slow: right after, even less traffic changes nothing.
    _traffic(deployment, 0.5)
    for allocation in staying:
        _report(allocation, {"http": 24000 + allocation.pk, "metrics": 25000 + allocation.pk})
    held = autoscale_evaluate(deployment_id=deployment.pk)
    assert held is not None and held.action == "hold" and "cooldown" in held.reason


def test_without_a_metric_nothing_changes_and_the_sweep_goes_on(gpus):
    deployment = _deployment([gpus[0]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)  # no gateway has measured it
    assert autoscale_all() == 0
    policy = ScalingPolicy.objects.get(pk=deployment.pk)
    assert policy.state == ScalingState.NO_METRIC and policy.evaluated_at is not None
    deployment.refresh_from_db()
    assert deployment.replicas == 1


def test_scale_to_zero_needs_a_balancer_metric():
    from fleet.allocations.services import DeploymentRequest, deployment_create

    bare = deployment_create(
        name="gpu-util", request=DeploymentRequest(kind="mps", memory_mib=4096), replicas=1
    )
    with pytest.raises(ServiceError) as refused:
        autoscaling_set(
            deployment_id=bare.pk,
            spec={"min": 0, "max": 2, "target": {"gpu_utilization_percent": 50}},
        )
    assert refused.value.details["field"] == "min"


def test_a_request_at_zero_replicas_brings_the_first_one_back_at_once(gpus):
    from fleet.autoscaling.services import autoscale_activate

    deployment = _deployment([gpus[0]])
    autoscaling_set(
        deployment_id=deployment.pk,
        spec={**POLICY, "min": 0, "scale_in_cooldown_s": 0, "activation_timeout_s": 120},
    )
    slot = deployment.endpoint.slot
    assert autoscale_activate(slot=slot) == 120.0  # one replica already: only wait for it
    assert Deployment.objects.get(pk=deployment.pk).replicas == 1
    _traffic(deployment, 0.0)
    decision = autoscale_evaluate(deployment_id=deployment.pk)
    assert decision is not None and (decision.action, decision.replicas) == ("in", 0)
    assert Deployment.objects.get(pk=deployment.pk).replicas == 0
    assert not Allocation.objects.placed().filter(deployment=deployment).exists()
    _traffic(deployment, 0.0)
    held = autoscale_evaluate(deployment_id=deployment.pk)
    assert held is not None and held.action == "hold" and "zero" in held.reason
    # A request arrives at the gateway: the first replica is placed now, not at the next beat.
    assert autoscale_activate(slot=slot) == 120.0
    assert Deployment.objects.get(pk=deployment.pk).replicas == 1
    assert Allocation.objects.placed().filter(deployment=deployment).count() == 1
    woken = Operation.objects.filter(kind=OperationKind.AUTOSCALE).order_by("-pk").first()
    assert woken is not None and "from 0 to 1" in woken.summary
    # A deployment that does not scale to zero: the request is answered 503 at once.
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    assert autoscale_activate(slot=slot) is None
    assert autoscale_activate(slot=slot + 100) is None


def test_the_step_limit_setting_bounds_one_scale_out(gpus, settings):
    settings.FLEET_AUTOSCALE_MAX_STEP_OUT = 1
    deployment = _deployment([gpus[0], gpus[0]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    _traffic(deployment, 20.0)  # 5 wanted; a step of 1, or a doubling: 4
    decision = autoscale_evaluate(deployment_id=deployment.pk)
    assert decision is not None and (decision.action, decision.replicas) == ("out", 4)
    assert decision.desired == 5


def test_a_new_policys_first_scale_in_waits_its_cooldown_from_when_it_was_set(gpus):
    deployment = _deployment([gpus[0], gpus[1]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    _traffic(deployment, 1.0)  # 1 replica would do, right after the policy was set
    held = autoscale_evaluate(deployment_id=deployment.pk)
    assert held is not None and held.action == "hold" and "scale-in cooldown" in held.reason
    later = timezone.now() + timedelta(seconds=301)
    _traffic(deployment, 1.0)
    shrunk = autoscale_evaluate(deployment_id=deployment.pk, now=later)
    assert shrunk is not None and (shrunk.action, shrunk.replicas) == ("in", 1)
