"""One fit function: on random fleets, every target the preview ranks is one the place service
commits, and every refusal it explains is refused by the place service with the same code.

Fleets mix MIG GPUs (with MPS inside some instances), MPS GPUs with random policies, dedicated
GPUs, cordons and sick GPUs; deployments ask for MIG profiles, MPS shares and whole GPUs, some
already partly placed. Each commit runs in a savepoint that is rolled back, so one fleet serves
every check.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.rankings import deployment_ranking
from fleet.allocations.selectors import request_mix
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import ServiceError
from fleet.inventory.models import Gpu, GpuHealth
from fleet.mig import maximal_layouts, product_by_key
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.placement import RequestShape
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

PRODUCTS = ("h100-sxm5-80gb", "a30-24gb", "a100-sxm4-40gb")


class _Rollback(Exception):
    pass


def _policy(rng: random.Random) -> MpsPolicy:
    return MpsPolicy(
        default_active_thread_percentage=rng.choice([100, 50, 25]),
        default_pinned_mem_limit_mib=rng.choice([None, 4096, 12000]),
        max_clients=rng.choice([None, 2, 4]),
    )


def _layout(rng: random.Random, product_key: str) -> LayoutSpec:
    mode = rng.choice(["mig", "mig", "mps", "dedicated"])
    if mode == "mps":
        return LayoutSpec(mode="mps", mps=_policy(rng))
    if mode == "dedicated":
        return LayoutSpec(mode="dedicated")
    product = product_by_key(product_key)
    assert product is not None
    layout = rng.choice(maximal_layouts(product))
    kept = [i for i in layout if rng.random() < 0.7]
    return LayoutSpec(
        mode="mig",
        instances=tuple(
            MigInstanceSpec(i.profile_id, i.start, _policy(rng) if rng.random() < 0.3 else None)
            for i in kept
        ),
    )


def _fleet(rng: random.Random) -> None:
    for _ in range(rng.randint(1, 2)):
        host = HostFactory()
        for _ in range(rng.randint(2, 3)):
            key = rng.choice(PRODUCTS)
            gpu = GpuFactory(host=host, product_key=key)
            try:
                with transaction.atomic():
                    gpu_set_layout(gpu_id=gpu.pk, spec=_layout(rng, key))
            except ServiceError:  # a random policy too big for a small instance: no layout
                pass
            if rng.random() < 0.15:
                Gpu.objects.filter(pk=gpu.pk).update(cordoned=True)
            elif rng.random() < 0.1:
                Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY)


def _deployments(rng: random.Random) -> list[Deployment]:
    requests = [
        DeploymentRequest(
            kind="mig", profile=rng.choice(["1g.10gb", "3g.40gb", "1g.6gb", "2g.12gb"])
        ),
        DeploymentRequest(kind="mig", profile=rng.choice(["1g.5gb", "2g.20gb", "7g.80gb"])),
        DeploymentRequest(
            kind="mps",
            memory_mib=rng.choice([500, 4000, 12000, 30000]),
            max_compute_percent=rng.choice([None, 20, 60]),
        ),
        DeploymentRequest(kind="mps", memory_mib=rng.choice([1000, 8000])),
        DeploymentRequest(kind="gpu", gpu_count=rng.choice([1, 2])),
    ]
    out = []
    for n, request in enumerate(requests):
        deployment = deployment_create(name=f"d{n}", request=request, replicas=4)
        placed = rng.randint(0, 2)
        if placed:
            try:
                with transaction.atomic():
                    deployment_autoplace(deployment_id=deployment.pk, limit=placed)
            except ServiceError:
                pass  # nothing fits: the deployment waits, which is a case too
        out.append(deployment)
    return out


def _commit(deployment: Deployment, **where: Any) -> ServiceError | list[tuple[int, int]]:
    """Place one replica in a savepoint that is rolled back; what it wrote, or why not."""
    before = set(Allocation.objects.values_list("pk", flat=True))
    outcome: ServiceError | list[tuple[int, int]] = []
    try:
        with transaction.atomic():
            deployment_place(deployment_id=deployment.pk, **where)
            outcome = list(
                Allocation.objects.exclude(pk__in=before).values_list("gpu_id", "partition_id")
            )
            raise _Rollback
    except _Rollback:
        pass
    except ServiceError as error:
        outcome = error
    return outcome


def _agree(deployment: Deployment) -> int:
    ranking = deployment_ranking(deployment)
    checked = 0
    for target in ranking.feasible:
        if target.partition_id is not None:
            outcome = _commit(deployment, partition_id=target.partition_id)
        else:
            start = target.new_instance.start if target.new_instance else None
            outcome = _commit(deployment, gpu_id=target.gpu_id, start=start)
        assert not isinstance(outcome, ServiceError), (target, outcome)
        assert sorted(g for g, _ in outcome) == sorted(target.gpu_ids), (target, outcome)
        if target.partition_id is not None:
            assert {p for _, p in outcome} == {target.partition_id}
        checked += 1
    for refusal in ranking.infeasible:
        if refusal.partition_id is not None:
            outcome = _commit(deployment, partition_id=refusal.partition_id)
        else:
            outcome = _commit(deployment, gpu_id=refusal.gpu_id)
        assert isinstance(outcome, ServiceError), (refusal, outcome)
        assert outcome.code == refusal.violations[0].code, (refusal, outcome.as_dict())
        checked += 1
    return checked


@given(seed=st.integers(0, 10_000))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_preview_and_the_commit_agree_on_every_target_of_random_fleets(seed):
    rng = random.Random(seed)
    with transaction.atomic():
        _fleet(rng)
        checked = sum(_agree(d) for d in _deployments(rng))
        assert checked > 0
        transaction.set_rollback(True)


def test_an_mps_request_lands_in_a_mig_instance_that_runs_mps():
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk,
        spec=LayoutSpec(
            mode="mig",
            instances=(
                MigInstanceSpec("3g.40gb", 0, MpsPolicy()),
                MigInstanceSpec("3g.40gb", 4),
            ),
        ),
    )
    deployment = deployment_create(
        name="small", request=DeploymentRequest(kind="mps", memory_mib=4000), replicas=2
    )
    ranking = deployment_ranking(deployment)
    (target,) = ranking.feasible
    shared = gpu.partitions.get(start=0)
    assert target.partition_id == shared.pk
    deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    assert Allocation.objects.get(deployment=deployment).partition_id == shared.pk


def test_the_ranking_learns_the_request_mix_from_the_deployments_replicas_weighted():
    deployment_create(
        name="shares", request=DeploymentRequest(kind="mps", memory_mib=4000), replicas=3
    )
    deployment_create(
        name="more-shares", request=DeploymentRequest(kind="mps", memory_mib=4000), replicas=1
    )
    deployment_create(name="whole", request=DeploymentRequest(kind="gpu", gpu_count=2), replicas=4)

    mix = request_mix()

    assert dict(zip(mix.shapes, mix.weights, strict=True)) == {
        RequestShape("mps", memory_mib=4000): 0.5,
        RequestShape("gpu", gpu_count=2): 0.5,
    }


def test_without_deployments_the_mix_is_empty_and_the_engine_uses_its_neutral_one():
    assert request_mix().shapes == ()
