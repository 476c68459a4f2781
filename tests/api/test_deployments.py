"""Deployments: create, place (the UI's drop), evict, delete, auto-placement."""

from __future__ import annotations

import pytest

from fleet.allocations.models import Allocation, Deployment
from fleet.core.models import Operation
from fleet.inventory.models import Host
from fleet.partitioning.models import Partition
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


def create(client, **body):
    return client.post("/api/v1/deployments/", body, format="json")


def place(client, deployment_id, **target):
    return client.post(f"/api/v1/deployments/{deployment_id}/place", target, format="json")


def set_layout(client, gpu, body):
    response = client.put(f"/api/v1/gpus/{gpu.pk}/layout", body, format="json")
    assert response.status_code in (200, 202), response.json()


@pytest.fixture
def mig_gpu(operator_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    set_layout(
        operator_client,
        gpu,
        {
            "mode": "mig",
            "instances": [{"profile": "3g.40gb", "start": 4}, {"profile": "1g.10gb", "start": 0}],
        },
    )
    return gpu


@pytest.fixture
def mps_gpu(operator_client):
    gpu = GpuFactory(product_key="a30-24gb")
    set_layout(operator_client, gpu, {"mode": "mps", "mps": {"max_clients": 3}})
    return gpu


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"name": "chat", "kind": "mig", "profile": "1g.10gb", "replicas": 3},
            {"kind": "mig", "profile": "1g.10gb", "replicas": 3},
        ),
        (
            {"name": "asr", "kind": "mps", "memory_mib": 4096, "max_compute_percent": 30},
            {"kind": "mps", "memory_mib": 4096, "max_compute_percent": 30},
        ),
        (
            {"name": "train", "kind": "gpu", "gpu_count": 2},
            {"kind": "gpu", "gpu_count": 2, "replicas": 1},
        ),
    ],
)
def test_deployments_of_each_kind_are_created_pending(operator_client, body, expected):
    response = create(operator_client, **body)
    assert response.status_code == 201, response.json()
    out = response.json()
    assert {k: out[k] for k in expected} == expected
    # No GPU in this test's fleet: nothing fits, it waits.
    assert out["status"] == "waiting" and out["placed_replicas"] == 0
    assert Operation.objects.filter(kind="create_deployment", deployment_id=out["id"]).exists()


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "kind": "mig"},
        {"name": "x", "kind": "mps"},
        {"name": "x", "kind": "gpu"},
        {"name": "x", "kind": "mps", "memory_mib": 0},
        {"name": "x", "kind": "mps", "memory_mib": 10, "max_compute_percent": 101},
        {"name": "x", "kind": "mig", "profile": "1g.10gb", "memory_mib": 10},
        {"name": "x", "kind": "gpu", "gpu_count": 1, "replicas": 0},
        {"name": "bad name!", "kind": "gpu", "gpu_count": 1},
        {"name": "x", "kind": "tpu"},
    ],
)
def test_malformed_requests_are_400_and_write_nothing(operator_client, body):
    before = snapshot_rows()
    assert_error(create(operator_client, **body), 400, "invalid")
    assert snapshot_rows() == before


def test_names_are_unique(operator_client):
    create(operator_client, name="x", kind="gpu", gpu_count=1)
    assert_error(
        create(operator_client, name="x", kind="gpu", gpu_count=1), 409, "deployment.name_taken"
    )


def test_a_mig_replica_dropped_on_a_free_partition_is_bound_and_pushed(
    operator_client, mig_gpu, django_capture_on_commit_callbacks
):
    deployment = create(
        operator_client, name="chat", kind="mig", profile="mig-3g.40gb", replicas=2
    ).json()
    partition = Partition.objects.get(gpu=mig_gpu, start=4)
    with django_capture_on_commit_callbacks(execute=True):
        response = place(operator_client, deployment["id"], partition=partition.pk)
    assert response.status_code == 202, response.json()
    op = response.json()
    assert op["kind"] == "place" and op["status"] == "pending"
    # The push ran on commit (in-process in the embedded mode) and recorded the dispatch.
    assert Operation.objects.get(pk=op["id"]).status == "dispatched"
    allocation = Allocation.objects.get(deployment_id=deployment["id"])
    assert (allocation.partition_id, allocation.replica, allocation.state) == (
        partition.pk,
        0,
        "pending",
    )
    assert (
        operator_client.get(f"/api/v1/deployments/{deployment['id']}/").json()["status"]
        == "waiting"  # its other replica has no room left on the one GPU
    )
    host = Host.objects.get(pk=mig_gpu.host_id)
    assert host.dispatched_generation == host.desired_generation == op["generation"]


def test_dropping_on_a_gpu_creates_an_instance_in_free_space(operator_client, mig_gpu):
    deployment = create(operator_client, name="chat", kind="mig", profile="2g.20gb").json()
    response = place(operator_client, deployment["id"], gpu=mig_gpu.pk)
    assert response.status_code == 202
    assert response.json()["payload"]["created_partition"]
    created = Partition.objects.get(gpu=mig_gpu, profile_name="2g.20gb")
    assert created.start in (2,)  # 0:1 and 4:4 are taken; 2g fits only at 2
    assert Allocation.objects.get(deployment_id=deployment["id"]).partition_id == created.pk


def test_a_mig_replica_that_does_not_fit_changes_nothing(operator_client, mig_gpu):
    deployment = create(operator_client, name="big", kind="mig", profile="7g.80gb").json()
    before = snapshot_rows()
    assert_error(
        place(operator_client, deployment["id"], gpu=mig_gpu.pk), 422, "placement.no_free_space"
    )
    partition = Partition.objects.get(gpu=mig_gpu, start=0)
    assert_error(
        place(operator_client, deployment["id"], partition=partition.pk),
        422,
        "placement.profile_mismatch",
    )
    assert snapshot_rows() == before


def test_a_profile_the_product_does_not_have_is_refused(operator_client, mig_gpu):
    deployment = create(operator_client, name="a30ish", kind="mig", profile="1g.6gb").json()
    body = assert_error(
        place(operator_client, deployment["id"], gpu=mig_gpu.pk),
        422,
        "placement.profile_unavailable",
    )
    assert "1g.10gb" in body["details"]["violations"][0]["details"]["known_profiles"]


def test_a_busy_partition_is_refused(operator_client, mig_gpu):
    partition = Partition.objects.get(gpu=mig_gpu, start=0)
    first = create(operator_client, name="a", kind="mig", profile="1g.10gb").json()
    second = create(operator_client, name="b", kind="mig", profile="1g.10gb").json()
    assert place(operator_client, first["id"], partition=partition.pk).status_code == 202
    assert_error(
        place(operator_client, second["id"], partition=partition.pk),
        422,
        "placement.partition_busy",
    )


def test_mps_shares_are_counted_from_reservations(operator_client, mps_gpu):
    whole = Partition.objects.get(gpu=mps_gpu)
    big = create(operator_client, name="big", kind="mps", memory_mib=16_000, replicas=2).json()
    assert place(operator_client, big["id"], gpu=mps_gpu.pk).status_code == 202
    before = snapshot_rows()
    body = assert_error(
        place(operator_client, big["id"], partition=whole.pk), 422, "placement.memory"
    )
    refused = body["details"]["violations"][0]["details"]
    assert refused["free_mib"] == whole.memory_mib - 16_000
    assert refused["rule"] == "mps.memory_overcommit"  # the MPS rule behind the placement code
    assert snapshot_rows() == before


def test_mps_client_cap_is_enforced(operator_client, mps_gpu):
    small = create(operator_client, name="small", kind="mps", memory_mib=100, replicas=4).json()
    for _ in range(3):
        assert place(operator_client, small["id"], gpu=mps_gpu.pk).status_code == 202
    body = assert_error(
        place(operator_client, small["id"], gpu=mps_gpu.pk), 422, "placement.clients"
    )
    assert body["details"]["violations"][0]["details"]["rule"] == "mps.too_many_clients"


def test_an_mps_request_needs_an_mps_target(operator_client, mig_gpu):
    d = create(operator_client, name="m", kind="mps", memory_mib=100).json()
    assert_error(place(operator_client, d["id"], gpu=mig_gpu.pk), 422, "placement.mode_mismatch")


def test_a_whole_gpu_request_takes_n_free_gpus_on_one_host(operator_client):
    host = HostFactory()
    # Explicit indexes: the second GPU of a host is the next free one by index.
    gpus = [GpuFactory(host=host, product_key="l4-24gb", index=i) for i in range(3)]
    for gpu in gpus:
        set_layout(operator_client, gpu, {"mode": "dedicated"})
    d = create(operator_client, name="train", kind="gpu", gpu_count=2, replicas=2).json()
    assert place(operator_client, d["id"], gpu=gpus[0].pk).status_code == 202
    assert sorted(Allocation.objects.values_list("gpu_id", flat=True)) == [gpus[0].pk, gpus[1].pk]
    body = assert_error(
        place(operator_client, d["id"], gpu=gpus[2].pk), 422, "placement.no_free_gpus"
    )
    assert body["details"]["violations"][0]["details"] == {"needed": 2, "free": 1}


def test_cordoned_and_unhealthy_gpus_take_no_new_work(operator_client, mps_gpu):
    d = create(operator_client, name="m", kind="mps", memory_mib=100).json()
    operator_client.post(f"/api/v1/gpus/{mps_gpu.pk}/cordon", {}, format="json")
    assert_error(place(operator_client, d["id"], gpu=mps_gpu.pk), 422, "placement.cordoned")
    operator_client.post(f"/api/v1/gpus/{mps_gpu.pk}/uncordon", {}, format="json")
    type(mps_gpu).objects.filter(pk=mps_gpu.pk).update(health="unhealthy")
    assert_error(place(operator_client, d["id"], gpu=mps_gpu.pk), 422, "placement.unhealthy")


def test_placing_more_replicas_than_asked_is_a_conflict(operator_client, mps_gpu):
    d = create(operator_client, name="m", kind="mps", memory_mib=100).json()
    place(operator_client, d["id"], gpu=mps_gpu.pk)
    assert_error(place(operator_client, d["id"], gpu=mps_gpu.pk), 409, "deployment.fully_placed")
    assert operator_client.get(f"/api/v1/deployments/{d['id']}/").json()["status"] == "placed"


@pytest.mark.parametrize("target", [{}, {"gpu": 1, "partition": 1}, {"gpu": "x"}, {"partition": 0}])
def test_place_needs_exactly_one_target(operator_client, mps_gpu, target):
    d = create(operator_client, name="m", kind="mps", memory_mib=100).json()
    assert_error(place(operator_client, d["id"], **target), 400, "invalid")


def test_placing_on_missing_things_is_404(operator_client, mps_gpu):
    d = create(operator_client, name="m", kind="mps", memory_mib=100).json()
    assert_error(place(operator_client, d["id"], partition=999999), 404, "partition.not_found")
    assert_error(place(operator_client, d["id"], gpu=999999), 404, "gpu.not_found")
    assert_error(place(operator_client, 999999, gpu=mps_gpu.pk), 404, "deployment.not_found")


def test_evict_releases_capacity_and_keeps_partitions(operator_client, mig_gpu):
    d = create(operator_client, name="chat", kind="mig", profile="1g.10gb").json()
    place(operator_client, d["id"], gpu=mig_gpu.pk)
    response = operator_client.post(f"/api/v1/deployments/{d['id']}/evict", {}, format="json")
    assert response.status_code == 202
    assert [op["kind"] for op in response.json()] == ["evict"]
    assert not Allocation.objects.exists()
    assert Partition.objects.filter(gpu=mig_gpu).count() == 2
    assert_error(
        operator_client.post(f"/api/v1/deployments/{d['id']}/evict", {}, format="json"),
        409,
        "deployment.not_placed",
    )


def test_evict_one_replica(operator_client, mps_gpu):
    d = create(operator_client, name="m", kind="mps", memory_mib=100, replicas=2).json()
    place(operator_client, d["id"], gpu=mps_gpu.pk)
    place(operator_client, d["id"], gpu=mps_gpu.pk)
    operator_client.post(f"/api/v1/deployments/{d['id']}/evict", {"replica": 1}, format="json")
    assert list(Allocation.objects.values_list("replica", flat=True)) == [0]
    assert_error(
        operator_client.post(
            f"/api/v1/deployments/{d['id']}/evict", {"replica": -1}, format="json"
        ),
        400,
    )


def test_delete_evicts_then_removes(operator_client, mps_gpu):
    d = create(operator_client, name="m", kind="mps", memory_mib=100).json()
    place(operator_client, d["id"], gpu=mps_gpu.pk)
    assert operator_client.delete(f"/api/v1/deployments/{d['id']}/").status_code == 204
    assert not Deployment.objects.exists() and not Allocation.objects.exists()
    kinds = set(Operation.objects.values_list("kind", flat=True))
    assert {"evict", "delete_deployment"} <= kinds
    assert_error(operator_client.delete(f"/api/v1/deployments/{d['id']}/"), 404)


def test_auto_placement_places_every_replica(operator_client, mig_gpu):
    other = GpuFactory(product_key="h100-sxm5-80gb", host=mig_gpu.host)
    set_layout(operator_client, other, {"mode": "mig", "instances": []})
    response = create(
        operator_client, name="chat", kind="mig", profile="1g.10gb", replicas=4, auto=True
    )
    assert response.status_code == 201, response.json()
    assert response.json()["status"] == "placed"
    assert Allocation.objects.count() == 4


def test_auto_placement_that_cannot_finish_changes_nothing(operator_client, mps_gpu):
    before = snapshot_rows()
    body = assert_error(
        create(operator_client, name="m", kind="mps", memory_mib=20_000, replicas=2, auto=True), 422
    )
    assert body["details"]["violations"]
    assert snapshot_rows() == before


def test_lists_filter_allocations_partitions_and_operations(
    viewer_client, operator_client, mig_gpu
):
    d = create(operator_client, name="chat", kind="mig", profile="1g.10gb").json()
    place(operator_client, d["id"], gpu=mig_gpu.pk)
    allocations = viewer_client.get("/api/v1/allocations/", {"deployment": d["id"]}).json()
    assert allocations["count"] == 1 and allocations["results"][0]["deployment_name"] == "chat"
    free = viewer_client.get("/api/v1/partitions/", {"gpu": mig_gpu.pk, "free": "true"}).json()
    assert [p["profile_name"] for p in free["results"]] == ["3g.40gb"]
    ops = viewer_client.get("/api/v1/operations/", {"kind": "place"}).json()
    assert ops["count"] == 1 and ops["results"][0]["requested_by"] == "operator-user"
    one = viewer_client.get(f"/api/v1/operations/{ops['results'][0]['id']}/").json()
    assert one["deployment"] == d["id"]
    assert (
        viewer_client.get(f"/api/v1/allocations/{allocations['results'][0]['id']}/").status_code
        == 200
    )
    assert viewer_client.get(f"/api/v1/partitions/{free['results'][0]['id']}/").status_code == 200
    hosts = viewer_client.get("/api/v1/hosts/", {"status": "ready"}).json()
    assert hosts["results"][0]["gpu_count"] == 1
    assert viewer_client.get(f"/api/v1/hosts/{hosts['results'][0]['id']}/").status_code == 200


def test_targets_rank_fits_and_explain_misfits(viewer_client, operator_client, mig_gpu):
    cordoned = GpuFactory(product_key="h100-sxm5-80gb", host=mig_gpu.host)
    set_layout(operator_client, cordoned, {"mode": "mig", "instances": []})
    operator_client.post(f"/api/v1/gpus/{cordoned.pk}/cordon", {}, format="json")
    mps = GpuFactory(product_key="a30-24gb", host=mig_gpu.host)
    set_layout(operator_client, mps, {"mode": "mps", "mps": {}})
    d = create(operator_client, name="chat", kind="mig", profile="3g.40gb").json()
    body = viewer_client.get(f"/api/v1/deployments/{d['id']}/targets").json()
    assert body["strategy"] == "product"
    free = Partition.objects.get(gpu=mig_gpu, start=4)
    assert body["feasible"][0]["partition"] == free.pk  # a free partition of the profile first
    reasons = {r["gpu"]: {v["code"] for v in r["violations"]} for r in body["infeasible"]}
    assert "placement.cordoned" in reasons[cordoned.pk]
    assert "placement.mode_mismatch" in reasons[mps.pk]
    assert_error(viewer_client.get("/api/v1/deployments/999999/targets"), 404)


def test_auto_placement_takes_the_engines_choice_of_placement(operator_client):
    gpu = GpuFactory(product_key="a100-sxm4-40gb")
    set_layout(operator_client, gpu, {"mode": "mig", "instances": []})
    response = create(operator_client, name="one", kind="mig", profile="1g.5gb", auto=True)
    assert response.status_code == 201
    # The engine keeps the large placements free: a lone 1g goes to the end of the grid.
    assert Partition.objects.get(gpu=gpu).start == 6


def test_defrag_proposes_the_moves_that_make_room_and_changes_nothing(
    operator_client, viewer_client
):
    host = HostFactory()
    a, b = (GpuFactory(host=host, product_key="h100-sxm5-80gb") for _ in range(2))
    # Each GPU keeps a 1g busy in the middle of the grid: no 7g fits anywhere.
    for gpu in (a, b):
        set_layout(
            operator_client, gpu, {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 3}]}
        )
    small = create(operator_client, name="small", kind="mig", profile="1g.10gb", replicas=2).json()
    for gpu in (a, b):
        place(operator_client, small["id"], partition=Partition.objects.get(gpu=gpu).pk)
    big = create(operator_client, name="big", kind="mig", profile="7g.80gb").json()
    before = snapshot_rows()
    plan = viewer_client.get(f"/api/v1/deployments/{big['id']}/defrag").json()
    assert snapshot_rows() == before
    assert not plan["fits_now"] and plan["target"] is not None
    moved = [m for m in plan["moves"] if m["allocation"] is not None]
    assert len(moved) == 1 and moved[0]["kind"] == "mig"
    assert (
        moved[0]["from_gpu"] == plan["target"]["gpu"] and moved[0]["to_gpu"] != moved[0]["from_gpu"]
    )
    assert Allocation.objects.filter(pk=moved[0]["allocation"]).exists()
    fits = viewer_client.get(f"/api/v1/deployments/{small['id']}/defrag")
    assert fits.status_code == 200  # fully placed deployments get a plan for a next replica too
