"""Autoscaling on a replica's own Prometheus metric (issue 24): the policy is checked (the metric
name's grammar, a declared port, a value above 0); the desired state asks the agents to read it;
the readings arrive through the real telemetry ingest, another host's are ignored; the rule
averages (or sums) them over the ready replicas and scales out; with no reading the policy says
the metric is not available and nothing changes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet.agents import ingest
from fleet.agents.documents import host_desired_state
from fleet.allocations.models import Allocation, Deployment
from fleet.autoscaling.models import ScalingPolicy, ScalingState
from fleet.autoscaling.policy import as_spec, autoscaling_set
from fleet.autoscaling.services import autoscale_evaluate
from fleet.core.errors import ServiceError
from fleet.core.models import Operation, OperationKind
from fleet.inventory.models import Gpu, Host
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from hostagent import protocol
from tests.autoscaling.test_services import _deployment
from tests.factories import GpuFactory, HostFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("mem_store")]

WAITING = {"name": "vllm:num_requests_waiting", "value": 5, "port": "metrics"}
POLICY: dict[str, Any] = {"min": 1, "max": 8, "target": {"replica_metric": WAITING}}


@pytest.fixture
def gpus() -> list[Gpu]:
    host = HostFactory(runtime="docker", address="10.0.0.9")
    found = []
    for index in range(2):
        gpu = GpuFactory(host=host, index=index, product_key="h100-sxm5-80gb")
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
        found.append(gpu)
    return found


def _gpu_sample(gpu: Gpu) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "status": "ok",
        "utilization_gpu_percent": None,
        "memory_used_mib": None,
        "memory_total_mib": None,
        "temperature_c": None,
        "power_mw": None,
        "ecc_corrected": None,
        "ecc_uncorrected": None,
        "processes": [],
        "mig": [],
    }


def _readings(
    host: Host, values: dict[int, float | None], *, age_s: float = 0.0, error: str = ""
) -> None:
    """A telemetry tick of ``host`` carrying readings (allocation id -> value), through the
    codec and the ingest the agent sockets use."""
    now = time.time()
    telemetry = protocol.validate_message(
        {
            "type": "telemetry",
            "ts": now,
            "gpus": [_gpu_sample(g) for g in Gpu.objects.filter(host=host)],
            "replica_metrics": [
                {
                    "allocation_id": aid,
                    "name": WAITING["name"],
                    "value": value,
                    "ts": now,
                    "error": "" if value is not None else error,
                }
                for aid, value in values.items()
            ],
        }
    )
    host = Host.objects.get(pk=host.pk)
    ingest.ingest(
        [ingest.Tick(host.pk, host.created_at.timestamp(), now - age_s, telemetry)]  # type: ignore[arg-type]
    )


def _replicas(deployment: Deployment) -> list[Allocation]:
    return list(Allocation.objects.placed().filter(deployment=deployment).order_by("replica"))


def test_a_replica_metric_policy_is_checked_and_reads_back_with_its_defaults(gpus):
    deployment = _deployment([gpus[0]])
    bad = [
        ({"name": "9lives", "value": 5, "port": "metrics"}, "target.replica_metric.name"),
        ({"name": "a b", "value": 5, "port": "metrics"}, "target.replica_metric.name"),
        ({**WAITING, "value": 0}, "target.replica_metric.value"),
        ({**WAITING, "value": -3}, "target.replica_metric.value"),
        ({**WAITING, "value": float("nan")}, "target.replica_metric.value"),
        ({**WAITING, "value": True}, "target.replica_metric.value"),
        ({**WAITING, "port": "Metrics!"}, "target.replica_metric.port"),
        ({**WAITING, "path": "metrics"}, "target.replica_metric.path"),
        ({**WAITING, "path": "/m etrics"}, "target.replica_metric.path"),
        ({**WAITING, "aggregate": "max"}, "target.replica_metric.aggregate"),
        ({**WAITING, "labels": {}}, "target.replica_metric.labels"),
        (5, "target.replica_metric"),
    ]
    for target, field in bad:
        with pytest.raises(ServiceError) as refused:
            autoscaling_set(
                deployment_id=deployment.pk, spec={**POLICY, "target": {"replica_metric": target}}
            )
        assert refused.value.code == "autoscaling.invalid", target
        assert refused.value.details["field"] == field, (target, refused.value.details)
    with pytest.raises(ServiceError) as refused:
        autoscaling_set(deployment_id=deployment.pk, spec={**POLICY, "min": 0})
    assert refused.value.details["field"] == "min"
    with pytest.raises(ServiceError) as refused:
        autoscaling_set(
            deployment_id=deployment.pk,
            spec={**POLICY, "target": {"replica_metric": {**WAITING, "port": "grpc"}}},
        )
    assert (refused.value.code, refused.value.status_code) == ("autoscaling.port_unknown", 422)
    assert refused.value.details["declared"] == ["http", "metrics"]
    assert not ScalingPolicy.objects.exists()

    policy = autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    assert policy is not None
    assert as_spec(policy)["target"] == {
        "replica_metric": {**WAITING, "value": 5.0, "path": "/metrics", "aggregate": "average"}
    }
    audit = Operation.objects.get(kind=OperationKind.SET_AUTOSCALING)
    assert "vllm:num_requests_waiting (average over the replicas) at 5" in audit.summary


def test_the_desired_state_asks_the_agent_to_read_the_metric_of_each_replica(gpus):
    deployment = _deployment([gpus[0], gpus[1]])
    host = gpus[0].host

    def scrapes() -> list[Any]:
        document = host_desired_state(Host.objects.get(pk=host.pk))
        allocations = [a for g in document["gpus"].values() for a in g["allocations"]]
        return [a.get("scrape") for a in allocations]

    assert scrapes() == [None, None]
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    wanted = {"port": "metrics", "path": "/metrics", "names": ["vllm:num_requests_waiting"]}
    assert scrapes() == [wanted, wanted]
    protocol.validate_message(host_desired_state(Host.objects.get(pk=host.pk)))  # on the wire
    autoscaling_set(deployment_id=deployment.pk, spec=None)
    assert scrapes() == [None, None]


def test_the_replicas_readings_scale_the_deployment_out(gpus):
    deployment = _deployment([gpus[0], gpus[1]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    first, second = _replicas(deployment)
    _readings(gpus[0].host, {first.pk: 12.0, second.pk: 8.0})  # 10 waiting per replica, on 5

    decision = autoscale_evaluate(deployment_id=deployment.pk)

    assert decision is not None and (decision.action, decision.replicas) == ("out", 4)
    assert decision.per_replica == 10.0
    deployment.refresh_from_db()
    assert deployment.replicas == 4
    operation = Operation.objects.get(kind=OperationKind.AUTOSCALE)
    assert operation.payload["metric_name"] == "vllm:num_requests_waiting"
    assert "vllm:num_requests_waiting 10 against a target of 5" in operation.summary


def test_near_the_target_it_holds_and_below_it_scales_in(gpus):
    deployment = _deployment([gpus[0], gpus[1]])
    autoscaling_set(deployment_id=deployment.pk, spec={**POLICY, "scale_in_cooldown_s": 0})
    first, second = _replicas(deployment)
    _readings(gpus[0].host, {first.pk: 5.2, second.pk: 4.9})
    held = autoscale_evaluate(deployment_id=deployment.pk)
    assert held is not None and held.action == "hold" and "within 10 %" in held.reason
    _readings(gpus[0].host, {first.pk: 1.0, second.pk: 0.0})
    shrunk = autoscale_evaluate(deployment_id=deployment.pk)
    assert shrunk is not None and (shrunk.action, shrunk.replicas) == ("in", 1)


def test_sum_counts_a_replica_without_a_reading_as_zero_and_average_leaves_it_out(gpus):
    deployment = _deployment([gpus[0], gpus[1]])
    first, _ = _replicas(deployment)
    summed = {"replica_metric": {**WAITING, "aggregate": "sum"}}
    autoscaling_set(deployment_id=deployment.pk, spec={**POLICY, "target": summed})
    _readings(gpus[0].host, {first.pk: 12.0})
    decision = autoscale_evaluate(deployment_id=deployment.pk)
    assert decision is not None and decision.per_replica == 6.0  # 12 over 2 ready replicas
    assert (decision.action, decision.replicas) == ("out", 3)

    ScalingPolicy.objects.filter(pk=deployment.pk).update(metric_aggregate="average")
    again = autoscale_evaluate(deployment_id=deployment.pk)
    assert again is not None and again.per_replica == 12.0  # the one that reports


def test_without_a_reading_the_policy_says_the_metric_is_not_available(gpus):
    deployment = _deployment([gpus[0]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    (replica,) = _replicas(deployment)

    def evaluated() -> ScalingPolicy:
        decision = autoscale_evaluate(deployment_id=deployment.pk)
        assert decision is not None and decision.action == "hold"
        return ScalingPolicy.objects.get(pk=deployment.pk)

    # An agent older than replica metrics sends none.
    policy = evaluated()
    assert policy.state == ScalingState.NO_METRIC and policy.value is None
    assert policy.reason.startswith("vllm:num_requests_waiting not available: no ready replica")
    # The agent could not read it: its reason, never a number.
    _readings(gpus[0].host, {replica.pk: None}, error="GET :21000/metrics: ConnectionRefused")
    policy = evaluated()
    assert policy.state == ScalingState.NO_METRIC
    assert "ConnectionRefused" in policy.reason
    # A reading received long ago is not used.
    _readings(gpus[0].host, {replica.pk: 50.0}, age_s=120)
    assert evaluated().state == ScalingState.NO_METRIC
    deployment.refresh_from_db()
    assert deployment.replicas == 1


def test_an_agent_cannot_report_the_metric_of_another_hosts_replica(gpus):
    deployment = _deployment([gpus[0]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    (replica,) = _replicas(deployment)
    intruder = HostFactory()
    GpuFactory(host=intruder, index=0)
    _readings(intruder, {replica.pk: 1000.0})
    decision = autoscale_evaluate(deployment_id=deployment.pk)
    assert decision is not None and decision.action == "hold" and decision.per_replica is None
    assert ScalingPolicy.objects.get(pk=deployment.pk).state == ScalingState.NO_METRIC
