"""GPU reads and the layout command: MIG layouts, MPS policies, dedicated mode, cordons."""

from __future__ import annotations

import pytest

from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.partitioning.models import Partition
from tests.factories import GpuFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

BALANCED_H100 = [
    {"profile": "3g.40gb", "start": 4},
    {"profile": "2g.20gb", "start": 2},
    {"profile": "1g.10gb", "start": 0},
    {"profile": "1g.10gb", "start": 1},
]


@pytest.fixture
def h100():
    return GpuFactory(product_key="h100-sxm5-80gb")


def put_layout(client, gpu, body):
    return client.put(f"/api/v1/gpus/{gpu.pk}/layout", body, format="json")


def test_gpus_are_listed_and_filtered(viewer_client, h100):
    GpuFactory(product_key="a30-24gb", host=h100.host)
    assert viewer_client.get("/api/v1/gpus/").json()["count"] == 2
    only = viewer_client.get("/api/v1/gpus/", {"product": "A30"}).json()
    assert [g["product_name"] for g in only["results"]] == ["NVIDIA A30"]
    detail = viewer_client.get(f"/api/v1/gpus/{h100.pk}/").json()
    assert detail["uuid"] == h100.uuid and detail["host_name"] == h100.host.name


def test_gpus_filter_by_free_search_terms_and_the_readme_examples(
    viewer_client, operator_client, h100
):
    from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place

    a30 = GpuFactory(product_key="a30-24gb", host=h100.host)
    layout = put_layout(operator_client, h100, {"mode": "mig", "instances": BALANCED_H100})
    assert layout.status_code in (200, 202)
    chat = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=1
    )
    deployment_place(deployment_id=chat.pk, gpu_id=h100.pk)

    def ids(**params):
        found = viewer_client.get("/api/v1/gpus/", params).json()["results"]
        return {g["id"] for g in found}

    assert ids(free="true") == {a30.pk} and ids(free="false") == {h100.pk}
    assert ids(q="chat") == {h100.pk}  # a deployment on it
    assert ids(q=f"{h100.host.name} a30") == {a30.pk}  # every term
    assert ids(mode="mig", product="H100") == {h100.pk}  # README's examples keep working
    assert ids(cordoned="false", health="healthy") == {h100.pk, a30.pk}


def test_a_missing_gpu_is_404(viewer_client, operator_client):
    assert_error(viewer_client.get("/api/v1/gpus/999999/"), 404, "not_found")
    assert_error(
        operator_client.put("/api/v1/gpus/999999/layout", {"mode": "dedicated"}, format="json"),
        404,
        "gpu.not_found",
    )


def test_a_valid_mig_layout_creates_partitions_and_an_operation(operator_client, h100):
    response = put_layout(operator_client, h100, {"mode": "mig", "instances": BALANCED_H100})
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["kind"] == "set_layout" and body["status"] == "pending" and body["generation"] == 1
    parts = sorted(
        Partition.objects.filter(gpu=h100).values_list("profile_name", "start", "size"),
        key=lambda p: p[1],
    )
    assert parts == [("1g.10gb", 0, 1), ("1g.10gb", 1, 1), ("2g.20gb", 2, 2), ("3g.40gb", 4, 4)]
    h100.refresh_from_db()
    assert h100.mode == "mig" and h100.mig_enabled
    assert Host.objects.get(pk=h100.host_id).desired_generation == 1
    listed = "3g.40gb@4, 2g.20gb@2, 1g.10gb@0, 1g.10gb@1"
    assert body["summary"].endswith(f" to MIG {listed}"), body["summary"]


def test_profiles_can_be_given_by_nvml_id(operator_client, h100):
    response = put_layout(
        operator_client, h100, {"mode": "mig", "instances": [{"profile": "0", "start": 0}]}
    )
    assert response.status_code == 202
    assert Partition.objects.get(gpu=h100).profile_name == "7g.80gb"
    # The operation says it as people read it: profile names, never NVML ids (issue 27).
    assert response.json()["summary"].endswith(" to MIG 7g.80gb@0"), response.json()["summary"]


def test_an_overlapping_layout_is_refused_with_every_violation_and_nothing_written(
    operator_client, h100
):
    before = snapshot_rows()
    response = put_layout(
        operator_client,
        h100,
        {
            "mode": "mig",
            "instances": [
                {"profile": "3g.40gb", "start": 0},
                {"profile": "4g.40gb", "start": 0},
                {"profile": "2g.20gb", "start": 3},
            ],
        },
    )
    body = assert_error(response, 422)
    codes = {v["code"] for v in body["details"]["violations"]}
    assert "mig.overlap" in codes and "mig.placement_not_allowed" in codes
    assert snapshot_rows() == before


def test_an_unknown_profile_is_refused_and_lists_the_known_ones(operator_client, h100):
    before = snapshot_rows()
    body = assert_error(
        put_layout(
            operator_client, h100, {"mode": "mig", "instances": [{"profile": "9g.1tb", "start": 0}]}
        ),
        422,
        "mig.unknown_profile",
    )
    assert "3g.40gb" in body["details"]["known_profiles"]
    assert snapshot_rows() == before


def test_mig_mode_on_a_gpu_without_mig_is_refused(operator_client):
    l4 = GpuFactory(product_key="l4-24gb")
    assert_error(
        put_layout(operator_client, l4, {"mode": "mig", "instances": []}), 422, "mig.not_supported"
    )


def test_mps_mode_creates_a_whole_gpu_partition_with_the_policy(operator_client, h100):
    response = put_layout(
        operator_client,
        h100,
        {"mode": "mps", "mps": {"default_active_thread_percentage": 50, "max_clients": 8}},
    )
    assert response.status_code == 202
    whole = Partition.objects.get(gpu=h100)
    assert (
        whole.kind,
        whole.mps_enabled,
        whole.mps_default_active_thread_percentage,
        whole.mps_max_clients,
    ) == ("gpu", True, 50, 8)


def test_an_invalid_mps_policy_is_refused(operator_client, h100):
    before = snapshot_rows()
    body = assert_error(
        put_layout(
            operator_client,
            h100,
            {"mode": "mps", "mps": {"default_pinned_mem_limit_mib": 10_000_000}},
        ),
        422,
    )
    assert body["details"]["violations"]
    assert snapshot_rows() == before


def test_mps_inside_a_mig_instance(operator_client, h100):
    response = put_layout(
        operator_client,
        h100,
        {
            "mode": "mig",
            "instances": [{"profile": "3g.40gb", "start": 4, "mps": {"max_clients": 4}}],
        },
    )
    assert response.status_code == 202
    assert Partition.objects.get(gpu=h100).mps_enabled


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"mode": "turbo"},
        {"mode": "mig", "instances": [{"profile": "1g.10gb"}]},
        {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": -1}]},
        {"mode": "mps", "mps": {"default_active_thread_percentage": 0}},
        {"mode": "mps", "mps": {"max_clients": 49}},
    ],
)
def test_malformed_layouts_are_400(operator_client, h100, body):
    before = snapshot_rows()
    assert_error(put_layout(operator_client, h100, body), 400, "invalid")
    assert snapshot_rows() == before


def test_instances_need_mig_mode_and_policies_need_mps_mode(operator_client, h100):
    assert_error(
        put_layout(
            operator_client,
            h100,
            {"mode": "dedicated", "instances": [{"profile": "1g.10gb", "start": 0}]},
        ),
        400,
        "layout.instances_need_mig_mode",
    )
    assert_error(
        put_layout(operator_client, h100, {"mode": "dedicated", "mps": {}}),
        400,
        "layout.mps_needs_mps_mode",
    )


def test_the_same_layout_twice_is_a_finished_no_op(operator_client, h100):
    put_layout(operator_client, h100, {"mode": "mig", "instances": BALANCED_H100})
    response = put_layout(
        operator_client, h100, {"mode": "mig", "instances": list(reversed(BALANCED_H100))}
    )
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"
    assert Host.objects.get(pk=h100.host_id).desired_generation == 1


def test_a_reshape_keeps_matching_partitions(operator_client, h100):
    put_layout(operator_client, h100, {"mode": "mig", "instances": BALANCED_H100})
    kept = Partition.objects.get(gpu=h100, start=4).pk
    put_layout(
        operator_client,
        h100,
        {
            "mode": "mig",
            "instances": [{"profile": "3g.40gb", "start": 4}, {"profile": "4g.40gb", "start": 0}],
        },
    )
    assert Partition.objects.get(gpu=h100, start=4).pk == kept
    assert Partition.objects.filter(gpu=h100).count() == 2


def test_destroying_a_busy_partition_is_refused_with_the_deployments_named(operator_client, h100):
    put_layout(operator_client, h100, {"mode": "mig", "instances": BALANCED_H100})
    deployment = operator_client.post(
        "/api/v1/deployments/", {"name": "chat", "kind": "mig", "profile": "3g.40gb"}, format="json"
    ).json()
    busy = Partition.objects.get(gpu=h100, start=4)
    assert (
        operator_client.post(
            f"/api/v1/deployments/{deployment['id']}/place", {"partition": busy.pk}, format="json"
        ).status_code
        == 202
    )
    before = snapshot_rows()
    body = assert_error(
        put_layout(
            operator_client,
            h100,
            {"mode": "mig", "instances": [{"profile": "7g.80gb", "start": 0}]},
        ),
        409,
        "layout.partition_in_use",
    )
    assert body["details"]["busy"][0]["deployments"] == ["chat"]
    assert snapshot_rows() == before
    assert_error(
        put_layout(operator_client, h100, {"mode": "dedicated"}), 409, "layout.partition_in_use"
    )


def test_an_mps_policy_that_cannot_hold_its_clients_is_refused(operator_client, h100):
    put_layout(operator_client, h100, {"mode": "mps", "mps": {}})
    whole = Partition.objects.get(gpu=h100)
    for name in ("a", "b"):
        d = operator_client.post(
            "/api/v1/deployments/", {"name": name, "kind": "mps", "memory_mib": 1024}, format="json"
        ).json()
        operator_client.post(
            f"/api/v1/deployments/{d['id']}/place", {"partition": whole.pk}, format="json"
        )
    assert_error(
        put_layout(operator_client, h100, {"mode": "mps", "mps": {"max_clients": 1}}),
        409,
        "layout.mps_policy_conflicts_with_allocations",
    )
    assert_error(
        put_layout(
            operator_client, h100, {"mode": "mps", "mps": {"default_pinned_mem_limit_mib": 512}}
        ),
        409,
        "layout.mps_policy_conflicts_with_allocations",
    )
    assert (
        put_layout(operator_client, h100, {"mode": "mps", "mps": {"max_clients": 2}}).status_code
        == 202
    )


def test_cordon_and_uncordon_are_recorded(operator_client, h100):
    response = operator_client.post(
        f"/api/v1/gpus/{h100.pk}/cordon", {"reason": "ECC errors"}, format="json"
    )
    assert response.status_code == 200 and response.json()["kind"] == "cordon"
    h100.refresh_from_db()
    assert h100.cordoned and h100.cordon_reason == "ECC errors"
    operator_client.post(f"/api/v1/gpus/{h100.pk}/uncordon", {}, format="json")
    h100.refresh_from_db()
    assert not h100.cordoned
    assert list(Operation.objects.filter(gpu=h100).values_list("kind", flat=True)) == [
        "uncordon",
        "cordon",
    ]


def test_agent_reported_placements_override_the_catalog(operator_client, h100):
    # This GPU's driver only allows 1g instances at slices 0 and 1.
    Gpu.objects.filter(pk=h100.pk).update(reported_placements={"19": [[0, 1], [1, 1]]})
    assert (
        put_layout(
            operator_client,
            h100,
            {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 1}]},
        ).status_code
        == 202
    )
    assert_error(
        put_layout(
            operator_client,
            h100,
            {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 5}]},
        ),
        422,
        "mig.placement_not_allowed",
    )


@pytest.mark.parametrize("profile", ["\u00b3", "1\u00b2", "\u00b3g.40gb"])
def test_a_profile_written_with_superscript_digits_is_refused_not_a_crash(
    operator_client, h100, profile
):
    """'³'.isdigit() is true but int('³') raises: found by schemathesis as a 500."""
    before = snapshot_rows()
    response = put_layout(
        operator_client, h100, {"mode": "mig", "instances": [{"profile": profile, "start": 0}]}
    )
    assert 400 <= response.status_code < 500, response.content
    assert snapshot_rows() == before
