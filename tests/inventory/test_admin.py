"""The Django admin covers the inventory; adding a host there shows its enrollment token once."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.inventory.models import Host
from fleet.inventory.services import host_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_browser(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def test_adding_a_host_in_the_admin_shows_its_enrollment_token_once(admin_browser):
    response = admin_browser.post(
        "/admin/inventory/host/add/",
        {
            "name": "gpu-07",
            "labels": "{}",
            "status": "offline",
            "gpus-TOTAL_FORMS": "0",  # the GPU inline's management form
            "gpus-INITIAL_FORMS": "0",
        },
        follow=True,
    )
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert any("Enrollment token for gpu-07" in m and "fle_" in m for m in shown)
    host = Host.objects.get(name="gpu-07")
    assert host.enrollment_token_hash and all(host.enrollment_token_hash not in m for m in shown)


def test_an_admin_action_issues_a_new_enrollment_token(admin_browser):
    host, old = host_create(name="gpu-08")
    response = admin_browser.post(
        "/admin/inventory/host/",
        {"action": "issue_enrollment_token", "_selected_action": [host.pk]},
        follow=True,
    )
    shown = " ".join(str(m) for m in response.context["messages"])
    assert "fle_" in shown and old not in shown
    host.refresh_from_db()
    from fleet.core.tokens import hash_token

    assert host.enrollment_token_hash != hash_token(old)


def test_an_admin_action_revokes_the_agent_token(admin_browser):
    from fleet.agents.enrollment import host_authenticate, host_issue_token

    host, _ = host_create(name="gpu-09")
    token = host_issue_token(host)
    response = admin_browser.post(
        "/admin/inventory/host/",
        {"action": "revoke_agent_token", "_selected_action": [host.pk]},
        follow=True,
    )
    assert "Revoked the agent token of 1 host" in " ".join(
        str(m) for m in response.context["messages"]
    )
    assert host_authenticate(token) is None


@pytest.mark.parametrize(
    "page",
    [
        "/admin/inventory/gpu/",
        "/admin/core/operation/",
        "/admin/allocations/deployment/",
        "/admin/core/apitoken/",
    ],
)
def test_the_admin_lists_the_inventory(admin_browser, page):
    assert admin_browser.get(page).status_code == 200


def test_viewers_and_operators_cannot_use_the_admin(viewer, operator):
    for user in (viewer, operator):
        client = Client()
        client.force_login(user)
        assert client.get("/admin/inventory/host/").status_code == 302


def test_the_admin_shows_gpus_and_deployments_but_changes_neither(admin_browser):
    """Their rows change only through services that keep placements within capacity: an edit
    or a delete here would free capacity that running replicas still hold."""
    from fleet.allocations.services import DeploymentRequest, deployment_create
    from fleet.inventory.services import gpu_upsert

    host, _ = host_create(name="gpu-10")
    gpu = gpu_upsert(
        host=host,
        index=0,
        uuid="GPU-admin-0",
        product_name="NVIDIA H100 80GB HBM3",
        product_key="h100-sxm5-80gb",
        memory_mib=81559,
        mig_capable=True,
    )
    deployment = deployment_create(
        name="chat", request=DeploymentRequest(kind="mps", memory_mib=4096), replicas=1
    )
    for model, pk, change in (
        ("inventory/gpu", gpu.pk, {"memory_mib": "999999", "mode": "mps", "cordoned": "on"}),
        ("allocations/deployment", deployment.pk, {"memory_mib": "1", "replicas": "9"}),
    ):
        page = admin_browser.get(f"/admin/{model}/{pk}/change/")
        assert page.status_code == 200 and b'name="_save"' not in page.content
        admin_browser.post(f"/admin/{model}/{pk}/change/", change)
        assert admin_browser.get(f"/admin/{model}/{pk}/delete/").status_code == 403
        assert admin_browser.get(f"/admin/{model}/add/").status_code == 403
    gpu.refresh_from_db()
    deployment.refresh_from_db()
    assert (gpu.memory_mib, gpu.cordoned) == (81559, False)
    assert (deployment.memory_mib, deployment.replicas) == (4096, 1)


def test_a_hosts_status_is_not_edited_in_the_admin(admin_browser):
    """Ready, cordoned, draining: only the services that also move or keep the replicas."""
    host, _ = host_create(name="gpu-11")
    admin_browser.post(
        f"/admin/inventory/host/{host.pk}/change/",
        {
            "name": "gpu-11",
            "labels": '{"zone": "a"}',
            "status": "ready",
            "gpus-TOTAL_FORMS": "0",
            "gpus-INITIAL_FORMS": "0",
        },
    )
    host.refresh_from_db()
    assert host.labels == {"zone": "a"} and host.status == "offline"
