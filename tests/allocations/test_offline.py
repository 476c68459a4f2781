"""Unreachable is not failed: an offline host's replicas wait out a grace period, nothing moves
while most hosts are offline together, evictions are rate-limited per GPU product, and GPU
faults a live agent reports still move replicas at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.agents.reports import agent_event
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.mps import MpsPolicy
from fleet.partitioning.delivery import hosts_mark_offline
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.tasks import mark_offline_hosts
from fleet.workflows import offline
from fleet.workflows.offline import eviction_slots, hosts_evict_offline, hosts_offline_share
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

GRACE_S = 300


@pytest.fixture(autouse=True)
def _offline_settings(settings):
    settings.FLEET_EVICT_OFFLINE_AFTER_SECONDS = GRACE_S
    settings.FLEET_MASS_OFFLINE_FRACTION = 0.55
    settings.FLEET_EVICT_RATE_FRACTION = 0.2
    settings.FLEET_EVICT_RATE_WINDOW_SECONDS = 60


def enrolled_fleet(count: int, product: str = "a30-24gb") -> list[Gpu]:
    """``count`` enrolled hosts (an agent holds their token), one MPS GPU each."""
    gpus = []
    for _ in range(count):
        gpu = GpuFactory(host=HostFactory(token_hash="enrolled"), product_key=product)
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
        gpus.append(gpu)
    return gpus


def replica_on(gpu: Gpu) -> int:
    """A one-replica deployment placed on ``gpu``; returns the deployment id."""
    deployment = deployment_create(
        name=f"d{gpu.pk}", request=DeploymentRequest(kind="mps", memory_mib=1024), replicas=1
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    return deployment.pk


def gpu_of(deployment_id: int) -> int | None:
    return (
        Allocation.objects.filter(deployment_id=deployment_id)
        .values_list("gpu_id", flat=True)
        .first()
    )


def go_offline(*gpus: Gpu, seconds_ago: float) -> None:
    Host.objects.filter(pk__in=[g.host_id for g in gpus]).update(
        status="offline", offline_since=timezone.now() - timedelta(seconds=seconds_ago)
    )


def kinds(kind: str) -> list[Operation]:
    return list(Operation.objects.filter(kind=kind).order_by("id"))


def test_a_quiet_host_is_offline_at_once_but_keeps_its_replicas_within_the_grace():
    quiet, _, _ = gpus = enrolled_fleet(3)
    deployment = replica_on(quiet)
    Host.objects.filter(pk=quiet.host_id).update(
        last_seen_at=timezone.now() - timedelta(seconds=60)
    )
    Host.objects.exclude(pk=quiet.host_id).update(last_seen_at=timezone.now())
    mark_offline_hosts()
    host = Host.objects.get(pk=quiet.host_id)
    assert host.status == "offline" and host.offline_since is not None
    assert gpu_of(deployment) == quiet.pk
    assert not kinds("replace") and not kinds("evict_host")
    assert all(Host.objects.get(pk=g.host_id).status == "ready" for g in gpus[1:])


def test_replicas_move_once_their_host_is_offline_longer_than_the_grace():
    dead, _, _ = enrolled_fleet(3)
    deployment = replica_on(dead)
    go_offline(dead, seconds_ago=GRACE_S - 5)
    assert hosts_evict_offline() == []
    go_offline(dead, seconds_ago=GRACE_S + 1)
    assert hosts_evict_offline() == [dead.host_id]
    assert gpu_of(deployment) not in (None, dead.pk)
    (claim,) = kinds("evict_host")
    assert claim.host_id == dead.host_id and claim.status == "succeeded"
    assert claim.result["replace"] == [op.pk for op in kinds("replace")]
    assert hosts_evict_offline() == []  # nothing left to move


def test_a_host_back_within_the_grace_keeps_everything_and_forgets_when_it_went_quiet():
    back, _, _ = enrolled_fleet(3)
    deployment = replica_on(back)
    go_offline(back, seconds_ago=GRACE_S - 5)
    Host.objects.filter(pk=back.host_id).update(status="ready", last_seen_at=timezone.now())
    hosts_mark_offline()
    assert Host.objects.get(pk=back.host_id).offline_since is None
    assert hosts_evict_offline(now=timezone.now() + timedelta(seconds=GRACE_S)) == []
    assert gpu_of(deployment) == back.pk
    assert not Operation.objects.filter(kind__in=["evict", "replace", "evict_host"]).exists()


def test_nothing_moves_while_most_hosts_are_offline_together_and_the_episode_is_recorded_once():
    gpus = enrolled_fleet(4)
    deployments = [replica_on(g) for g in gpus[:3]]
    go_offline(*gpus[:3], seconds_ago=GRACE_S + 60)  # 3 of 4: more than 55 %
    assert hosts_offline_share().mass
    for _ in range(3):
        assert hosts_evict_offline() == []
    assert [gpu_of(d) for d in deployments] == [g.pk for g in gpus[:3]]
    (started,) = kinds("mass_offline")
    assert started.payload == {"active": True, "offline": 3, "enrolled": 4}
    assert "evictions paused" in started.summary
    Host.objects.filter(pk__in=[g.host_id for g in gpus[:3]]).update(status="ready")
    for _ in range(3):
        assert hosts_evict_offline() == []
    started_again, ended = kinds("mass_offline")
    assert started_again == started and ended.payload["active"] is False
    assert not Operation.objects.filter(kind__in=["evict", "replace", "evict_host"]).exists()


def test_a_minority_offline_is_no_mass_offline_and_its_replicas_move():
    gpus = enrolled_fleet(4)
    deployment = replica_on(gpus[0])
    go_offline(*gpus[:2], seconds_ago=GRACE_S + 1)  # 2 of 4: 50 %, not more than 55 %
    assert not hosts_offline_share().mass
    assert hosts_evict_offline() == [gpus[0].host_id]
    assert gpu_of(deployment) in (gpus[2].pk, gpus[3].pk)
    assert not kinds("mass_offline")


def test_hosts_not_enrolled_count_for_nothing_in_the_share():
    gpus = enrolled_fleet(2)
    HostFactory.create_batch(3, status="offline")  # created, no agent yet
    go_offline(gpus[0], seconds_ago=1)
    assert (hosts_offline_share().offline, hosts_offline_share().enrolled) == (1, 2)
    assert not hosts_offline_share().mass


def test_hosts_still_offline_when_a_mass_offline_ends_get_a_whole_grace_from_then():
    gpus = enrolled_fleet(4)
    deployment = replica_on(gpus[0])
    go_offline(*gpus[:3], seconds_ago=GRACE_S + 60)
    assert hosts_evict_offline() == []
    Host.objects.filter(pk__in=[g.host_id for g in gpus[1:3]]).update(status="ready")
    ended_at = timezone.now()
    assert hosts_evict_offline(now=ended_at) == []  # the end: gpus[0]'s grace restarts
    assert Host.objects.get(pk=gpus[0].host_id).offline_since == ended_at
    assert gpu_of(deployment) == gpus[0].pk
    later = ended_at + timedelta(seconds=GRACE_S + 1)
    assert hosts_evict_offline(now=later) == [gpus[0].host_id]
    assert gpu_of(deployment) != gpus[0].pk


@pytest.mark.parametrize(
    ("hosts", "slots"), [(1, 1), (4, 1), (9, 1), (10, 2), (14, 2), (15, 3), (100, 20)]
)
def test_a_product_evicts_a_fifth_of_its_hosts_per_window_and_one_below_ten(hosts, slots):
    assert eviction_slots(hosts) == slots


def age_claims(seconds: float) -> None:
    Operation.objects.filter(kind="evict_host").update(
        created_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_below_ten_hosts_a_product_has_one_host_evicted_per_window():
    gpus = enrolled_fleet(5)
    deployments = [replica_on(g) for g in gpus[:2]]
    go_offline(gpus[0], seconds_ago=GRACE_S + 20)
    go_offline(gpus[1], seconds_ago=GRACE_S + 10)
    assert hosts_evict_offline() == [gpus[0].host_id]  # the longest offline goes first
    assert hosts_evict_offline() == []  # the window's slot is taken
    assert gpu_of(deployments[1]) == gpus[1].pk
    age_claims(61)
    assert hosts_evict_offline() == [gpus[1].host_id]
    assert gpu_of(deployments[1]) not in (None, gpus[1].pk)


def test_a_product_of_ten_hosts_or_more_evicts_a_fifth_of_them_per_window():
    gpus = enrolled_fleet(10)
    for gpu in gpus[:3]:
        replica_on(gpu)
    go_offline(*gpus[:3], seconds_ago=GRACE_S + 1)
    assert len(hosts_evict_offline()) == 2
    assert hosts_evict_offline() == []
    age_claims(61)
    assert len(hosts_evict_offline()) == 1
    assert Allocation.objects.filter(gpu__host__status="offline").count() == 0


def test_the_rate_is_counted_per_gpu_product():
    a30s, h100s = enrolled_fleet(3), enrolled_fleet(3, product="h100-sxm5-80gb")
    replica_on(a30s[0]), replica_on(h100s[0])
    go_offline(a30s[0], h100s[0], seconds_ago=GRACE_S + 1)
    assert sorted(hosts_evict_offline()) == sorted([a30s[0].host_id, h100s[0].host_id])


def test_a_host_back_between_its_claim_and_its_eviction_keeps_its_replicas():
    dead, _, _ = enrolled_fleet(3)
    deployment = replica_on(dead)
    go_offline(dead, seconds_ago=GRACE_S + 1)
    claims = offline._claim([dead.host_id], timezone.now())
    Host.objects.filter(pk=dead.host_id).update(status="ready")
    assert offline._evict_host(dead.host_id, claims[dead.host_id]) is False
    assert gpu_of(deployment) == dead.pk


@pytest.mark.parametrize(
    ("kind", "detail"), [("xid", "Xid 79"), ("mps_down", "MPS daemon down"), ("gpu_lost", "")]
)
def test_gpu_faults_a_live_agent_reports_move_replicas_at_once_even_during_a_mass_offline(
    django_capture_on_commit_callbacks, kind, detail
):
    sick, healthy, *quiet = enrolled_fleet(5)
    deployment = replica_on(sick)
    go_offline(*quiet, seconds_ago=1)  # 3 of 5
    assert hosts_offline_share().mass
    with django_capture_on_commit_callbacks(execute=True):
        agent_event(
            host=sick.host,
            event={
                "type": "event",
                "kind": kind,
                "gpu_uuid": sick.uuid,
                "gpu_instance_id": None,
                "xid": 79 if kind == "xid" else None,
                "detail": detail,
                "ts": timezone.now().timestamp(),
            },
        )
    assert gpu_of(deployment) == healthy.pk
    assert kinds("replace")[-1].status == "succeeded"


def test_every_dashboard_page_shows_a_banner_while_most_hosts_are_offline(operator):
    gpus = enrolled_fleet(3)
    browser = Client()
    browser.force_login(operator)
    assert "mass-offline-banner" not in browser.get("/operations/").content.decode()
    go_offline(*gpus[:2], seconds_ago=1)
    for page in ("/", "/operations/", f"/gpus/{gpus[2].pk}/"):
        html = browser.get(page).content.decode()
        assert "mass-offline-banner" in html and "2 of 3 hosts are offline together" in html
    Host.objects.update(status="ready")
    assert "mass-offline-banner" not in browser.get("/").content.decode()


def test_the_sign_in_page_asks_nothing_about_hosts(django_assert_num_queries):
    with django_assert_num_queries(0):
        html = Client().get("/login/").content.decode()
    assert "mass-offline-banner" not in html
