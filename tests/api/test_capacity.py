"""``GET /capacity/``: what fits now and after a reshape, MPS and whole GPUs, fragmentation, and
how many replicas of one request fit."""

from __future__ import annotations

import pytest

from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.inventory.models import HostStatus
from fleet.mps import MpsPolicy
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

MEM = 81920  # H100 SXM5 80GB, as the factory makes it


@pytest.fixture
def fleet():
    """One ready host: a MIG GPU (3g.40gb busy at 0, 1g.10gb idle at 4), an MPS GPU with a
    20,000 MiB client, a free dedicated GPU; and a cordoned host with one more GPU."""
    ready = HostFactory()
    mig, mps, free = (GpuFactory(host=ready) for _ in range(3))
    GpuFactory(host=HostFactory(status=HostStatus.CORDONED))
    gpu_set_layout(
        gpu_id=mig.pk,
        spec=LayoutSpec(
            mode="mig",
            instances=(MigInstanceSpec("3g.40gb", 0), MigInstanceSpec("1g.10gb", 4)),
        ),
    )
    gpu_set_layout(gpu_id=mps.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    gpu_set_layout(gpu_id=free.pk, spec=LayoutSpec(mode="dedicated"))
    chat = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    deployment_place(deployment_id=chat.pk, partition_id=Partition.objects.get(gpu=mig, start=0).pk)
    embed = deployment_create(
        name="embed", request=DeploymentRequest(kind="mps", memory_mib=20000), replicas=1
    )
    deployment_place(deployment_id=embed.pk, gpu_id=mps.pk)
    return ready


def test_capacity_counts_each_profile_mps_and_whole_gpus_per_product(viewer_client, fleet):
    body = viewer_client.get("/api/v1/capacity/").json()

    (h100,) = body["products"]
    fits = {
        p["profile"]: (p["fits_now"], p["fits_if_idle_reshaped"]) for p in h100["mig"]["profiles"]
    }
    assert (h100["product"], h100["gpus"], h100["schedulable_gpus"]) == (
        "NVIDIA H100 80GB HBM3",
        4,
        3,
    )
    assert h100["mig"]["gpus"] == 1
    assert fits["1g.10gb"] == (3, 3)
    assert fits["3g.40gb"] == (0, 1)
    assert fits["7g.80gb"] == (0, 0)
    assert h100["mps"] == {
        "gpus": 1,
        "free_memory_mib": MEM - 20000,
        "stranded_memory_mib": 0,
        "free_clients": 47,
    }
    assert h100["whole"] == {"free_gpus": 1}


def test_fragmentation_is_measured_per_schedulable_host(viewer_client, fleet):
    fragmentation = viewer_client.get("/api/v1/capacity/").json()["fragmentation"]

    (host,) = fragmentation["hosts"]
    assert (host["host_id"], host["host"]) == (fleet.pk, fleet.name)
    assert 0 <= fragmentation["score"] <= 1
    assert fragmentation["stranded_gpu_equivalents"] == host["stranded_gpu_equivalents"]
    assert fragmentation["free_gpu_equivalents"] > fragmentation["stranded_gpu_equivalents"]


@pytest.mark.parametrize(
    ("query", "now", "reshaped"),
    [
        ("kind=mig&profile=1g.10gb", 3, 3),
        ("kind=mig&profile=mig-3g.40gb", 0, 1),
        ("kind=mps&memory_mib=20000", 3, None),
        ("kind=mps&memory_mib=20000&max_compute_percent=50", 3, None),
        ("kind=gpu&gpu_count=1", 1, None),
        ("kind=gpu&gpu_count=2", 0, None),
    ],
)
def test_a_request_in_the_query_says_how_many_replicas_fit(
    viewer_client, fleet, query, now, reshaped
):
    answer = viewer_client.get(f"/api/v1/capacity/?{query}").json()["request"]
    assert (answer["fits_now"], answer["fits_if_idle_reshaped"]) == (now, reshaped)


def test_the_request_answer_echoes_the_request_and_splits_it_per_product(viewer_client, fleet):
    answer = viewer_client.get("/api/v1/capacity/?kind=mig&profile=1g.10gb").json()["request"]
    assert answer["kind"] == "mig" and answer["profile"] == "1g.10gb"
    assert answer["products"] == [
        {
            "product": "NVIDIA H100 80GB HBM3",
            "product_key": "h100-sxm5-80gb",
            "fits_now": 3,
            "fits_if_idle_reshaped": 3,
        }
    ]


def test_every_role_can_read_capacity_and_anonymous_users_cannot(
    viewer_client, operator_client, admin_client, anon_client, fleet
):
    for client in (viewer_client, operator_client, admin_client):
        assert client.get("/api/v1/capacity/").status_code == 200
    assert_error(anon_client.get("/api/v1/capacity/"), 401)


@pytest.mark.parametrize(
    "query",
    [
        "kind=mig",
        "kind=banana",
        "kind=mig&profile=9g.99gb",
        "kind=mps&memory_mib=0",
        "kind=mps&memory_mib=lots",
        "kind=mps&memory_mib=1000&max_compute_percent=101",
        "kind=mps&profile=1g.10gb&memory_mib=1000",
        "kind=gpu&gpu_count=65",
        "profile=1g.10gb",
        "memory=1000",
    ],
)
def test_a_bad_request_query_is_a_400_envelope(viewer_client, fleet, query):
    assert_error(viewer_client.get(f"/api/v1/capacity/?{query}"), 400, "invalid")


def test_the_number_of_queries_does_not_grow_with_the_fleet(
    viewer_client, fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(40) as small:
        viewer_client.get("/api/v1/capacity/?kind=mig&profile=1g.10gb")
    host = HostFactory()
    for _ in range(6):
        gpu = GpuFactory(host=host)
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    with django_assert_max_num_queries(len(small.captured_queries)):
        viewer_client.get("/api/v1/capacity/?kind=mig&profile=1g.10gb")


def test_the_schema_documents_the_request_parameters(viewer_client):
    schema = viewer_client.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/capacity/"]["get"]
    names = {p["name"] for p in operation["parameters"]}
    assert {"kind", "profile", "memory_mib", "max_compute_percent", "gpu_count"} <= names
    assert "400" in operation["responses"]
