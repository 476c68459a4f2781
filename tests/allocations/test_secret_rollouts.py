"""A rolling update's operation stays in the audit trail that every viewer reads: it shows each
env value as a digest, keeps the previous workload encrypted only while a rollback may need it,
and a rollback still gives the deployment its previous values back."""

from __future__ import annotations

import json

import pytest

from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import RuleViolation
from fleet.core.models import Operation, OperationStatus
from fleet.core.secrets import value_digest
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.deployment_rollouts import deployment_rollout_advance
from tests.allocations.test_rollouts import _copies, _new_copy, _report
from tests.factories import GpuFactory, HostFactory, allow_process

pytestmark = pytest.mark.django_db

V1 = {"runtime": "process", "command": ["/opt/serve"], "env": {"DB_PASSWORD": "s3cr3t-v1"}}
V2 = {"runtime": "process", "command": ["/opt/serve"], "env": {"DB_PASSWORD": "s3cr3t-v2"}}


@pytest.fixture(autouse=True)
def _setup(settings):
    settings.FLEET_ROLLOUT_MIN_READY_SECONDS = 0
    allow_process()


@pytest.fixture
def host():
    host = HostFactory(runtime="process", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    four = tuple(MigInstanceSpec("1g.10gb", s) for s in range(4))
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=four))
    return host


def _deployment(host) -> Deployment:
    deployment = deployment_create(
        name="llm",
        request=DeploymentRequest(kind="mig", profile="1g.10gb"),
        replicas=2,
        workload=V1,
    )
    free = iter(Partition.objects.filter(gpu__host=host, kind="mig").order_by("start"))
    for _ in range(2):
        deployment_place(deployment_id=deployment.pk, partition_id=next(free).pk)
    _report(host, dict.fromkeys(_copies(deployment), "running"))
    return deployment


def _audit() -> str:
    return json.dumps(list(Operation.objects.values("payload", "result", "summary", "reason")))


def test_a_rollout_shows_digests_of_env_values_and_forgets_the_sealed_previous_at_the_end(host):
    deployment = _deployment(host)

    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2)

    assert operation.payload["previous"]["env"] == {"DB_PASSWORD": value_digest("s3cr3t-v1")}
    assert operation.payload["workload"]["env"] == {"DB_PASSWORD": value_digest("s3cr3t-v2")}
    assert "sealed_previous" in operation.payload
    assert "s3cr3t" not in _audit()
    deployment_rollout_advance(operation_id=operation.pk)
    _report(host, {_new_copy(deployment): "running"})
    _report(host, {_new_copy(deployment): "running"})
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.payload
    assert "sealed_previous" not in operation.payload
    assert "s3cr3t" not in _audit()


def test_a_rollback_gives_the_deployment_and_its_replicas_their_previous_values_back(host):
    deployment = _deployment(host)
    operation = deployment_rollout_start(deployment_id=deployment.pk, workload=V2)
    deployment_rollout_advance(operation_id=operation.pk)
    _report(host, {_new_copy(deployment): "running"})  # replica 0 runs v2

    _report(host, {_new_copy(deployment): "failed"})  # replica 1's v2 fails: roll back

    operation.refresh_from_db()
    assert operation.payload["step"] == "rolling_back"
    assert Deployment.objects.get(pk=deployment.pk).workload["env"] == V1["env"]
    back = Allocation.objects.get(pk=_new_copy(deployment))
    assert back.workload["env"] == V1["env"]
    assert "s3cr3t" not in _audit()


def test_a_rollout_to_a_secret_the_team_does_not_have_is_refused(host):
    deployment = _deployment(host)
    with_ref = {**V1, "env": {"HF_TOKEN": {"secret": "missing"}}}

    with pytest.raises(RuleViolation) as refused:
        deployment_rollout_start(deployment_id=deployment.pk, workload=with_ref)

    assert refused.value.code == "secret.not_found"
    assert Deployment.objects.get(pk=deployment.pk).workload["env"] == V1["env"]
