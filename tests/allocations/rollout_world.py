"""The world the layout-rollout tests share: one host of three simulated H100s cut into two
3g.40gb each, its agent applying what it is told (``sync``), and helpers to run a rollout."""

from __future__ import annotations

import pytest

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.agent_sim import SimAgent

TWO_3G = LayoutSpec(
    mode="mig", instances=(MigInstanceSpec("3g.40gb", 0), MigInstanceSpec("3g.40gb", 4))
)
SEVEN = LayoutSpec(mode="mig", instances=(MigInstanceSpec("7g.80gb", 0),))
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(name="world")
def world_fixture(django_capture_on_commit_callbacks):  # imported by the test modules
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb"] * 3)
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready", labels={"pool": "a"})
    agent_hello(host=host, hello=agent.hello())
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=TWO_3G)

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return host, agent, gpus, sync


def run_rollout(sync, operation, rounds=12):
    for _ in range(rounds):
        sync()
        operation.refresh_from_db()
        if operation.status != "dispatched" or operation.payload.get("paused"):
            return operation
    return operation


def held(agent, gpu):
    return sorted((i.profile_id, i.start) for i in agent.backend.mig_instances(gpu.uuid))
