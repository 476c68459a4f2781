"""The audit trail is append-only and complete: token and user changes and every change made in
the Django admin appear in the operations feed; the admin cannot add, change or delete
operations, allocations or partitions."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.allocations.models import Allocation
from fleet.core.models import AlertDelivery, ApiToken, Operation, OperationKind
from fleet.core.operations import operation_record
from fleet.core.roles import Role
from fleet.core.services import user_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory

pytestmark = pytest.mark.django_db


def kinds() -> list[str]:
    return list(Operation.objects.order_by("id").values_list("kind", flat=True))


@pytest.fixture
def admin_web(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def test_creating_and_revoking_a_token_is_recorded_with_who(viewer_client, viewer):
    created = viewer_client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert created.status_code == 201
    assert viewer_client.delete(f"/api/v1/tokens/{created.json()['id']}/").status_code == 204
    ops = Operation.objects.filter(kind__in=["create_token", "revoke_token"]).order_by("id")
    assert [(o.kind, o.requested_by) for o in ops][-2:] == [
        ("create_token", viewer),
        ("revoke_token", viewer),
    ]
    assert "ci" in ops.last().summary
    assert all(o.status == "succeeded" for o in ops)


def test_a_user_created_or_given_a_role_is_recorded():
    user_create(username="ana", password=None, role=Role.OPERATOR)
    user_create(username="ana", password=None, role=Role.ADMIN)
    changes = Operation.objects.filter(kind="change_user").order_by("id")
    summaries = changes.values_list("summary", flat=True)
    assert list(summaries) == ["User ana created as operator", "User ana updated as admin"]


def test_changes_made_in_the_django_admin_join_the_feed(admin_web, admin_user):
    response = admin_web.post("/admin/auth/group/add/", {"name": "night-shift"})
    assert response.status_code == 302
    (op,) = Operation.objects.filter(kind=OperationKind.ADMIN_CHANGE)
    assert op.requested_by == admin_user
    assert op.summary == "Admin added group night-shift: Added."
    assert op.payload["model"] == "auth.group" and op.payload["action"] == "added"


def test_deleting_several_users_in_the_admin_is_one_recorded_change(admin_web):
    model = get_user_model()
    ids = [model.objects.create_user(f"u{i}").pk for i in range(3)]
    response = admin_web.post(
        "/admin/auth/user/",
        {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
    )
    assert response.status_code == 302
    assert not model.objects.filter(pk__in=ids).exists()
    (op,) = Operation.objects.filter(kind=OperationKind.ADMIN_CHANGE)
    assert op.summary.startswith("Admin deleted 3 users")


@pytest.mark.parametrize(
    "model", [Operation, Allocation, Partition, AlertDelivery], ids=lambda m: m.__name__
)
def test_the_admin_cannot_add_change_or_delete_audit_and_desired_rows(model, rf, admin_user):
    model_admin = admin.site._registry[model]
    request = rf.get("/admin/")
    request.user = admin_user
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)
    assert model_admin.has_view_permission(request)


def test_an_operation_page_in_the_admin_is_read_only_and_posting_changes_nothing(admin_web):
    op = operation_record(kind=OperationKind.CORDON, summary="keep me", status="succeeded")
    page = admin_web.get(f"/admin/core/operation/{op.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    response = admin_web.post(f"/admin/core/operation/{op.pk}/change/", {"summary": "forged"})
    assert response.status_code == 403
    assert (
        admin_web.post(f"/admin/core/operation/{op.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    op.refresh_from_db()
    assert op.summary == "keep me"


def test_partitions_cannot_be_deleted_from_the_admin(admin_web):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(
        gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("3g.40gb", 4),))
    )
    partition = Partition.objects.get(gpu=gpu)
    response = admin_web.post(
        f"/admin/partitioning/partition/{partition.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 403
    assert Partition.objects.filter(pk=partition.pk).exists()
    assert ApiToken.objects.count() == 0
