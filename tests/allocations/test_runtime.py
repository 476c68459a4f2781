"""A replica is placed only where its workload can run: the drop, the preview, auto-placement and
health re-placement all refuse a host whose agent lacks the runtime (``placement.runtime``), and
a process only goes where the agent allows processes (``placement.process_runtime``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.selectors import placement_demand, placement_demands
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Team
from fleet.inventory.models import Gpu
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.placement import Demand
from fleet.workflows.health import replace_allocations
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

CONTAINER = {"runtime": "container", "image": "registry.example/llm:1.2"}
PROCESS = {"runtime": "process", "command": ["serve"]}


def mps_gpu(name: str, runtime: str, *, process_runtime: bool = True) -> Gpu:
    """An A30 in MPS mode on its own host, whose agent runs ``runtime`` (and, unless told
    otherwise, was started with --allow-process-runtime)."""
    host = HostFactory(name=name, runtime=runtime, process_runtime=process_runtime)
    gpu = GpuFactory(host=host, product_key="a30-24gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    return gpu


def create(client, name: str, workload: dict[str, object], *, replicas: int = 1, auto=False):
    body = {
        "name": name,
        "kind": "mps",
        "memory_mib": 4096,
        "replicas": replicas,
        "workload": workload,
        "auto": auto,
    }
    return client.post("/api/v1/deployments/", body, format="json")


@pytest.mark.parametrize(
    ("workload", "demand"),
    [
        (None, Demand()),
        ({"runtime": "none"}, Demand()),
        (
            PROCESS,
            Demand(runtimes=("docker", "process"), workload="process", process_runtime=True),
        ),
        (CONTAINER, Demand(runtimes=("docker",), workload="container")),
    ],
)
def test_the_demand_names_the_host_runtimes_that_run_the_workload(workload, demand):
    allow_process()
    deployment = deployment_create(
        name="d",
        request=DeploymentRequest(kind="mps", memory_mib=1024),
        replicas=1,
        workload=workload,
    )
    # Every demand names the deployment's team (rule ``placement.host_reserved``).
    assert placement_demand(deployment) == replace(demand, team=deployment.team_id)


def test_a_container_replica_dropped_on_a_process_host_is_422_and_writes_nothing(
    operator_client,
):
    gpu = mps_gpu("gpu-proc", "process")
    deployment = create(operator_client, "llm", CONTAINER).json()
    before = snapshot_rows()

    response = operator_client.post(
        f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpu.pk}, format="json"
    )

    body = assert_error(response, 422, "placement.runtime")
    assert "gpu-proc runs workloads with the process runtime" in body["message"]
    assert "needs container" in body["message"]
    assert snapshot_rows() == before


def test_the_preview_explains_the_runtime_refusal(operator_client, viewer_client):
    refused = mps_gpu("gpu-proc", "process")
    fits = mps_gpu("gpu-docker", "docker")
    deployment = create(operator_client, "llm", CONTAINER).json()

    body = viewer_client.get(f"/api/v1/deployments/{deployment['id']}/targets").json()

    assert [t["gpu"] for t in body["feasible"]] == [fits.pk]
    (refusal,) = [r for r in body["infeasible"] if r["gpu"] == refused.pk]
    assert [v["code"] for v in refusal["violations"]] == ["placement.runtime"]


def test_auto_placement_puts_a_container_only_where_an_agent_runs_containers(operator_client):
    mps_gpu("a-none", "none")
    mps_gpu("b-proc", "process")
    docker = mps_gpu("c-docker", "docker")

    response = create(operator_client, "llm", CONTAINER, replicas=2, auto=True)

    assert response.status_code == 201, response.json()
    assert set(Allocation.objects.values_list("gpu_id", flat=True)) == {docker.pk}


def test_auto_placement_with_no_host_that_runs_the_workload_is_422(operator_client):
    mps_gpu("b-proc", "process")
    before = snapshot_rows()

    response = create(operator_client, "llm", CONTAINER, auto=True)

    body = assert_error(response, 422)
    codes = {v["code"] for v in body["details"]["violations"]}
    assert codes == {"placement.runtime"}
    assert snapshot_rows()["hosts"] == before["hosts"]
    assert not Allocation.objects.exists()


def test_a_process_replica_runs_on_docker_and_process_hosts_not_on_none():
    allow_process()
    mps_gpu("a-none", "none")
    process = mps_gpu("b-proc", "process")
    deployment = deployment_create(
        name="worker",
        request=DeploymentRequest(kind="mps", memory_mib=4096),
        replicas=1,
        workload=PROCESS,
    )

    deployment_place(deployment_id=deployment.pk, gpu_id=process.pk)

    assert Allocation.objects.get().gpu_id == process.pk


def test_a_process_replica_skips_hosts_whose_agent_does_not_allow_processes(operator_client):
    allow_process()
    mps_gpu("a-docker", "docker", process_runtime=False)
    allowed = mps_gpu("b-docker", "docker")

    response = create(operator_client, "worker", PROCESS, replicas=2, auto=True)

    assert response.status_code == 201, response.json()
    assert set(Allocation.objects.values_list("gpu_id", flat=True)) == {allowed.pk}


def test_a_process_replica_dropped_on_a_host_without_the_process_runtime_is_422(
    operator_client,
):
    allow_process()
    gpu = mps_gpu("gpu-docker", "docker", process_runtime=False)
    deployment = create(operator_client, "worker", PROCESS).json()
    before = snapshot_rows()

    response = operator_client.post(
        f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpu.pk}, format="json"
    )

    body = assert_error(response, 422, "placement.process_runtime")
    assert "--allow-process-runtime" in body["message"]
    assert snapshot_rows() == before


def test_a_container_replica_goes_to_a_host_without_the_process_runtime(operator_client):
    docker = mps_gpu("a-docker", "docker", process_runtime=False)

    response = create(operator_client, "llm", CONTAINER, auto=True)

    assert response.status_code == 201, response.json()
    assert Allocation.objects.get().gpu_id == docker.pk


def test_health_re_placement_moves_a_container_only_to_a_host_that_runs_it(
    django_capture_on_commit_callbacks,
):
    sick = mps_gpu("a-docker", "docker")
    mps_gpu("b-proc", "process")
    spare = mps_gpu("c-docker", "docker")
    deployment = deployment_create(
        name="llm",
        request=DeploymentRequest(kind="mps", memory_mib=4096),
        replicas=1,
        workload=CONTAINER,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=sick.pk)
    Gpu.objects.filter(pk=sick.pk).update(cordoned=True)

    with django_capture_on_commit_callbacks(execute=True):
        replace_allocations(gpu_id=sick.pk, reason="test")

    placed = Allocation.objects.exclude(state="releasing").get()
    assert placed.gpu_id == spare.pk


SERVER = {**CONTAINER, "health": {"http": {"port": 8080, "path": "/ready"}}}


def host_network_for_every_team() -> None:
    Team.objects.update(policy={"host_network": True})


def test_copies_of_a_host_network_workload_with_a_port_go_one_per_host(operator_client):
    """Containers in their host's network (the team's policy gives it) bind their port there:
    the second copy of a server listening on 8080 goes to the other host, though the first
    host's MPS GPU has room for both; a third copy has nowhere to go and says why."""
    host_network_for_every_team()
    near = mps_gpu("near", "docker")
    GpuFactory(host=near.host, product_key="a30-24gb")
    far = mps_gpu("far", "docker")
    created = create(operator_client, "server", SERVER, replicas=2, auto=True)
    assert created.status_code == 201, created.json()
    hosts = set(Allocation.objects.values_list("gpu__host__name", flat=True))
    assert hosts == {"near", "far"}
    demand = placement_demand(Allocation.objects.first().deployment)
    assert demand is not None and demand.port == 8080
    assert demand.avoid_hosts == {near.host_id, far.host_id}

    scaled = operator_client.patch(
        f"/api/v1/deployments/{created.json()['id']}/", {"replicas": 3}, format="json"
    )
    body = scaled.json()
    assert scaled.status_code == 422 and body["code"] == "placement.port_in_use", body
    deployment_id = created.json()["id"]
    targets = operator_client.get(f"/api/v1/deployments/{deployment_id}/targets").json()
    assert targets["feasible"] == []
    codes = {v["code"] for r in targets["infeasible"] for v in r["violations"]}
    assert "placement.port_in_use" in codes


@pytest.mark.parametrize("workload", [SERVER, {**PROCESS, "health": SERVER["health"]}])
def test_copies_with_host_ports_of_their_own_may_share_a_host(operator_client, workload):
    """Without the host's network, each replica gets host ports of its own from its agent: two
    copies of a server on port 8080 fit on one host, and no host is avoided. A process gets
    its own even where the team's policy gives containers the host's network."""
    if workload["runtime"] == "process":
        allow_process(host_network=True)
    near = mps_gpu("near", "docker")
    created = create(operator_client, "server", workload, replicas=2, auto=True)
    assert created.status_code == 201, created.json()
    assert set(Allocation.objects.values_list("gpu_id", flat=True)) == {near.pk}
    demand = placement_demand(Allocation.objects.first().deployment)
    assert demand is not None and demand.port == 0 and not demand.avoid_hosts


def test_a_workload_without_a_port_may_run_twice_on_one_host(operator_client):
    near = mps_gpu("near", "docker")
    created = create(operator_client, "batch", CONTAINER, replicas=2, auto=True)
    assert created.status_code == 201, created.json()
    assert set(Allocation.objects.values_list("gpu_id", flat=True)) == {near.pk}


def test_the_demands_of_many_deployments_are_read_at_once_and_the_same_as_one_by_one(
    operator_client, django_assert_max_num_queries
):
    """The tray asks for every deployment's demand: the hosts their copies hold are one query,
    however many deployments listen on a port (and the teams' policies are one more)."""
    host_network_for_every_team()
    mps_gpu("near", "docker")
    mps_gpu("far", "docker")
    for n in range(4):
        workload = SERVER if n % 2 else CONTAINER
        created = create(operator_client, f"server-{n}", workload, replicas=2, auto=True)
        assert created.status_code == 201, created.json()
    deployments = list(Deployment.objects.order_by("pk"))
    with django_assert_max_num_queries(2):
        together = placement_demands(deployments)
    assert together == {d.pk: placement_demand(d) for d in deployments}
    assert sum(1 for demand in together.values() if demand and demand.avoid_hosts) == 2
