"""Borrowing through the place path: past its deserved share a team places up to its limit on
capacity no other team's deserved share needs now; those replicas are marked ``borrowed`` (the
API shows it, a move keeps it, usage splits their hours); never past the limit."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from fleet.allocations.accounting.usage import Window, usage_report
from fleet.allocations.details import deployment_set_details
from fleet.allocations.models import Allocation, UsageInterval
from fleet.allocations.moves import allocation_move
from fleet.allocations.ownership import deployment_set_team
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import ServiceError
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import snapshot_rows

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


def whole_gpus(n):
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(n)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpus


def team_with(name, **quota):
    team = team_create(name=name)
    team_quota_set(team_id=team.pk, quota=quota)
    return team


def deployment(team, name, replicas):
    return deployment_create(name=name, request=WHOLE, replicas=replicas, team_id=team.pk)


def place_all(d, gpus):
    return [deployment_place(deployment_id=d.pk, gpu_id=gpu.pk) for gpu in gpus]


def borrowed_marks(d):
    return list(
        Allocation.objects.filter(deployment=d)
        .order_by("replica")
        .values_list("borrowed", flat=True)
    )


def test_past_its_deserved_share_a_team_borrows_up_to_its_limit_and_no_further():
    gpus = whole_gpus(4)
    team = team_with("search", gpus=1, limit={"gpus": 3})
    d = deployment(team, "train", 4)
    operations = place_all(d, gpus[:3])
    assert borrowed_marks(d) == [False, True, True]
    assert [op.payload["borrowed"] for op in operations] == [False, True, True]
    before = snapshot_rows()
    with pytest.raises(ServiceError) as refused:
        deployment_place(deployment_id=d.pk, gpu_id=gpus[3].pk)
    assert refused.value.code == "quota.exceeded"
    assert refused.value.details["quota"] == 3
    assert snapshot_rows() == before


def test_a_deserved_share_without_a_limit_stays_a_hard_cap():
    gpus = whole_gpus(2)
    team = team_with("search", gpus=1)
    d = deployment(team, "train", 2)
    place_all(d, gpus[:1])
    with pytest.raises(ServiceError) as refused:
        deployment_place(deployment_id=d.pk, gpu_id=gpus[1].pk)
    assert refused.value.code == "quota.exceeded"


def test_a_team_does_not_borrow_what_another_teams_deserved_share_waits_for(admin_client):
    gpus = whole_gpus(3)
    lender = team_with("ads", gpus=2)
    deployment(lender, "serve", 2)  # two replicas waiting, within its deserved share
    borrower = team_with("search", gpus=1, limit={"gpus": 3})
    d = deployment(borrower, "train", 3)
    place_all(d, gpus[:1])
    preview = admin_client.get(f"/api/v1/deployments/{d.pk}/targets").json()["quota"]
    assert [v["code"] for v in preview] == ["quota.borrow_unavailable"]
    before = snapshot_rows()
    with pytest.raises(ServiceError) as refused:
        deployment_place(deployment_id=d.pk, gpu_id=gpus[1].pk)
    assert refused.value.code == "quota.borrow_unavailable"
    assert refused.value.details["needed"] == 2 and refused.value.details["free"] == 2
    assert snapshot_rows() == before


def test_a_team_with_a_limit_and_no_deserved_share_only_borrows(admin_client):
    gpus = whole_gpus(2)
    team = team_with("batch", limit={"gpus": 2})
    d = deployment(team, "sweep", 2)
    place_all(d, gpus)
    assert borrowed_marks(d) == [True, True]
    listed = admin_client.get(f"/api/v1/allocations/?deployment={d.pk}").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [row["borrowed"] for row in rows] == [True, True]


def test_a_team_without_quota_never_borrows():
    gpus = whole_gpus(1)
    team = team_create(name="free")
    d = deployment(team, "any", 1)
    place_all(d, gpus)
    assert borrowed_marks(d) == [False]


def test_usage_splits_borrowed_hours_from_guaranteed_ones():
    gpus = whole_gpus(2)
    team = team_with("search", gpus=1, limit={"gpus": 2})
    place_all(deployment(team, "train", 2), gpus)
    assert sorted(UsageInterval.objects.values_list("borrowed", flat=True)) == [False, True]
    start = UsageInterval.objects.order_by("started_at").first().started_at
    now = start + timedelta(hours=2)
    report = usage_report(Window(start, now, "team", now=now))
    row = next(g for g in report["groups"] if g["name"] == "search")
    assert row["gpu_equivalent_hours"] == pytest.approx(4, abs=0.01)
    assert row["borrowed_gpu_equivalent_hours"] == pytest.approx(2, abs=0.01)
    assert report["totals"]["borrowed_gpu_equivalent_hours"] == pytest.approx(2, abs=0.01)


def test_a_moves_new_copy_keeps_the_borrowed_mark():
    gpus = whole_gpus(3)
    team = team_with("search", gpus=1, limit={"gpus": 2})
    d = deployment(team, "train", 2)
    place_all(d, gpus[:2])
    borrowed = Allocation.objects.get(deployment=d, borrowed=True)
    allocation_move(allocation_id=borrowed.pk, gpu_id=gpus[2].pk)
    copy = Allocation.objects.placed().filter(deployment=d, replica=borrowed.replica)
    # Nothing runs (runtime none): the new copy took over at once and the old one left.
    assert [(a.gpu_id, a.borrowed) for a in copy] == [(gpus[2].pk, True)]


def test_the_deployment_page_badges_borrowed_replicas_and_shows_the_priority(client, viewer):
    gpus = whole_gpus(2)
    team = team_with("search", gpus=1, limit={"gpus": 2})
    d = deployment(team, "train", 2)
    deployment_set_details(deployment_id=d.pk, details={"priority": "batch"})
    place_all(d, gpus)
    client.force_login(viewer)
    html = client.get(f"/deployments/{d.pk}/").content.decode()
    rows = re.findall(r'<tr data-replica="(\d)".*?</tr>', html, re.S)
    assert rows == ["0", "1"]
    badged = re.findall(r'<tr data-replica="(\d)"(?:(?!</tr>).)*data-borrowed', html, re.S)
    assert badged == ["1"]
    assert "priority batch" in html


def test_a_hand_over_is_held_by_the_new_teams_limit_not_its_deserved_share():
    gpus = whole_gpus(2)
    d = deployment(team_create(name="old"), "train", 2)
    place_all(d, gpus)
    taker = team_with("taker", gpus=1, limit={"gpus": 2})
    deployment_set_team(deployment_id=d.pk, team_id=taker.pk)
    d.refresh_from_db()
    assert d.team_id == taker.pk
    tight = team_with("tight", gpus=1)
    with pytest.raises(ServiceError) as refused:
        deployment_set_team(deployment_id=d.pk, team_id=tight.pk)
    assert refused.value.code == "quota.exceeded"
