"""One small world per workflow that runs on the engine: how to start one operation of the kind,
and how the agent applies what it asks for. The contract test (test_contract.py) runs each
through the same paces; a kind added to the registry without a scenario fails it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.drain import gpu_drain
from fleet.allocations.layout_rollouts import Selector, layout_rollout_start
from fleet.allocations.maintenance import host_drain
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.moves import allocation_move
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.core.teams import team_create, team_quota_set
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.defrag import deployment_defrag_apply
from fleet.workflows.reclaim import reclaim_start
from fleet.workflows.repack import capacity_repack_apply
from tests.agent_sim import SimAgent

H100 = "h100-sxm5-80gb"


@dataclass
class World:
    """A started operation's surroundings: ``start`` records one, ``sync`` has the agent apply
    the host's desired state and acknowledge it (running the wake-ups after commit)."""

    start: Callable[[], Operation]
    sync: Callable[[], None]
    adopts: bool = True  # its steps are operations of their own (Operation.parent)


def _host_with_small_replicas(capture, gpus: int) -> tuple[Host, Callable[[], None], Deployment]:
    """``gpus`` H100s, each with one replica of ``small`` on a 1g.10gb slice at start 0."""
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent([H100] * gpus)
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    rows = list(Gpu.objects.filter(host=host).order_by("index"))
    for gpu in rows:
        gpu_set_layout(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("1g.10gb", 0),))
        )
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=gpus
    )
    for gpu in rows:
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)

    def sync() -> None:
        with capture(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return host, sync, small


def defrag_world(capture) -> World:
    """Two H100s with a small replica each; a 4g.40gb fits only once one of them moves."""
    _, sync, _ = _host_with_small_replicas(capture, 2)
    big = deployment_create(
        name="big", request=DeploymentRequest(kind="mig", profile="4g.40gb"), replicas=1
    )
    return World(lambda: deployment_defrag_apply(deployment_id=big.pk), sync)


def reclaim_world(capture) -> World:
    """Two H100s with a borrowed small replica of *search* each; *ads*'s deserved share waits
    for a 4g.40gb, which fits only once one of them moves."""
    _, sync, small = _host_with_small_replicas(capture, 2)
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"limit": {"mig_compute_slices": 14}})
    Deployment.objects.filter(pk=small.pk).update(team=search)
    Allocation.objects.filter(deployment=small).update(borrowed=True)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"mig_compute_slices": 4})
    big = deployment_create(
        name="big",
        request=DeploymentRequest(kind="mig", profile="4g.40gb"),
        replicas=1,
        team_id=ads.pk,
    )
    return World(lambda: reclaim_start(deployment_id=big.pk), sync)


def repack_world(capture) -> World:
    """Three H100s with a small replica each: one GPU can be emptied."""
    _, sync, _ = _host_with_small_replicas(capture, 3)
    return World(lambda: capacity_repack_apply(product_key=H100, count=1), sync)


def move_world(capture) -> World:
    """A process replica running on one H100's 3g.40gb slice, moved to another H100's."""
    from tests.allocations.test_moves import _mig_gpu, _report, _running_replica, _target
    from tests.factories import allow_process

    allow_process()
    source, target = _mig_gpu(), _mig_gpu()
    old = _running_replica(source)

    def sync() -> None:  # the target's agent says the new copy runs
        for allocation in Allocation.objects.filter(gpu=target):
            _report(target, allocation.pk, "running")

    return World(
        lambda: allocation_move(allocation_id=old.pk, partition_id=_target(target)),
        sync,
        adopts=False,
    )


def _two_3g_gpus(capture) -> tuple[list[Gpu], Callable[[], None]]:
    """Two H100s of two 3g.40gb slices, a replica on the first one's slice 0."""
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent([H100, H100])
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    two = tuple(MigInstanceSpec("3g.40gb", start) for start in (0, 4))
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=two))
    chat = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    deployment_place(
        deployment_id=chat.pk, partition_id=Partition.objects.get(gpu=gpus[0], start=0).pk
    )

    def sync() -> None:
        with capture(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return gpus, sync


SEVEN = LayoutSpec(mode="mig", instances=(MigInstanceSpec("7g.80gb", 0),))


def drain_world(capture) -> World:
    """The first of two H100s drained and reshaped to one 7g.80gb (its replica moves to the
    second)."""
    gpus, sync = _two_3g_gpus(capture)
    return World(lambda: gpu_drain(gpu_id=gpus[0].pk, layout=SEVEN), sync)


def layout_rollout_world(capture) -> World:
    """Both H100s reshaped to one 7g.80gb, one at a time (the replica moves to the one done
    first)."""
    gpus, sync = _two_3g_gpus(capture)
    selector = Selector(gpus=tuple(gpu.pk for gpu in gpus))
    return World(lambda: layout_rollout_start(selector=selector, layout=SEVEN), sync)


def host_drain_world(capture) -> World:
    """A host running one process replica, drained onto a second host."""
    from tests.allocations.test_maintenance import _report
    from tests.allocations.test_moves import _mig_gpu, _running_replica
    from tests.factories import allow_process

    allow_process()
    source, target = _mig_gpu(), _mig_gpu()
    _running_replica(source)

    def sync() -> None:  # new copies run on the target; old ones have stopped on the source
        running = Allocation.objects.filter(gpu=target).values_list("pk", flat=True)
        _report(target.host_id, [(pk, "running") for pk in running])
        stopped = Allocation.objects.filter(gpu=source, state="releasing")
        _report(source.host_id, [(pk, "none") for pk in stopped.values_list("pk", flat=True)])

    return World(lambda: host_drain(host_id=source.host_id), sync)


def rollout_world(capture) -> World:
    """A process replica on an H100 with a free slice beside it and a second H100: rolled to a
    new command (its new copy counts at once: min_ready_s 0)."""
    from tests.allocations.test_moves import _mig_gpu, _report, _running_replica
    from tests.factories import allow_process

    allow_process()
    gpus = [_mig_gpu(), _mig_gpu()]
    old = _running_replica(gpus[0])
    new = {"runtime": "process", "command": ["/opt/models/serve-v2.sh"]}

    def sync() -> None:  # new copies run; old ones have stopped
        for allocation in Allocation.objects.filter(gpu__in=gpus).select_related("gpu"):
            state = "none" if allocation.state == "releasing" else "running"
            _report(allocation.gpu, allocation.pk, state)

    return World(
        lambda: deployment_rollout_start(
            deployment_id=old.deployment_id, workload=new, min_ready_s=0
        ),
        sync,
    )


SCENARIOS: dict[str, Callable[..., World]] = {
    "layout_rollout": layout_rollout_world,
    "rollout": rollout_world,
    "drain_host": host_drain_world,
    "defrag": defrag_world,
    "drain": drain_world,
    "move": move_world,
    "repack": repack_world,
    "reclaim": reclaim_world,
}
