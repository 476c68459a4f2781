"""Prometheus service discovery over the API: every ready replica's metrics port, labelled;
not the replicas that are not ready, nor those of teams whose specs the reader does not see."""

from __future__ import annotations

import pytest

from fleet.inventory.models import Host, HostStatus
from tests.allocations.test_ports import SERVER, _report
from tests.allocations.test_workloads import _placed
from tests.allocations.test_workloads import mig_gpu as mig_gpu  # the fixture

pytestmark = pytest.mark.django_db

PATH = "/api/v1/prometheus/targets"


def test_ready_replicas_metrics_ports_are_listed_with_their_labels(mig_gpu, viewer_client):
    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    allocation = _placed(mig_gpu, workload=SERVER)
    assert viewer_client.get(PATH).json() == []  # no ports reported yet
    _report(allocation, {"http": 20001, "metrics": 20002}, state="starting")
    assert viewer_client.get(PATH).json() == []  # not ready
    _report(allocation, {"http": 20001, "metrics": 20002})
    answer = viewer_client.get(PATH)
    assert answer.status_code == 200 and answer["Content-Type"].startswith("application/json")
    assert answer.json() == [
        {
            "targets": ["10.0.0.7:20002"],
            "labels": {
                "deployment": "llm",
                "team": "default",
                "replica": "0",
                "gpu_uuid": mig_gpu.uuid,
                "profile": "3g.40gb",
                "host": mig_gpu.host.name,
            },
        }
    ]
    Host.objects.filter(pk=mig_gpu.host_id).update(status=HostStatus.OFFLINE)
    assert viewer_client.get(PATH).json() == []


def test_a_workload_without_a_metrics_port_is_not_scraped(mig_gpu, viewer_client):
    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    workload = {**SERVER, "ports": [{"name": "http", "port": 8000}]}
    allocation = _placed(mig_gpu, workload=workload)
    _report(allocation, {"http": 20001})
    assert viewer_client.get(PATH).json() == []


def test_a_team_member_sees_only_its_teams_targets(mig_gpu, client, django_user_model):
    from fleet.core.models import Team, TeamMembership

    Host.objects.filter(pk=mig_gpu.host_id).update(address="10.0.0.7")
    allocation = _placed(mig_gpu, workload=SERVER)
    _report(allocation, {"http": 20001, "metrics": 20002})
    other = Team.objects.create(name="other", slug="other")
    outsider = django_user_model.objects.create_user("outsider", password="x-long-password-1")
    TeamMembership.objects.create(team=other, user=outsider, role="viewer")
    client.force_login(outsider)
    assert client.get(PATH).json() == []
    TeamMembership.objects.create(team_id=allocation.deployment.team_id, user=outsider)
    outsider._fleet_teams = None
    assert len(client.get(PATH).json()) == 1


def test_anonymous_is_401(client):
    assert client.get(PATH).status_code in (401, 403)
