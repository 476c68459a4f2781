"""The reclaim carried out: moves first (make before break), stops only if still needed, then the
claimant placed; no net gain touches nothing; a stopped replica's deployment is claimed off the
GPUs it left while the reclaim runs (no cycling); every reclaim is an operation with webhooks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.alerts import RECLAIM_FINISHED, RECLAIM_STARTED
from fleet.core.errors import Conflict, RuleViolation
from fleet.core.models import AlertDelivery, Operation, OperationKind
from fleet.core.operations import operation_record
from fleet.core.teams import team_create, team_quota_set
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.sharing.reclaiming import reclaims_start
from fleet.workflows.reclaim import reclaim_start
from tests.agent_sim import SimAgent
from tests.factories import GpuFactory, webhook
from tests.helpers import snapshot_rows
from tests.sharing.conftest import lend_whole_gpus, run_reclaim

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


@pytest.fixture
def lent_mig(django_capture_on_commit_callbacks, settings):
    """Two H100s, each with a borrowed 1g.10gb replica of *search* at start 0; *ads* (deserved 4
    compute slices) waits for a 4g.40gb, which fits on neither until one of them moves."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb", "h100-sxm5-80gb"])
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    for gpu in gpus:
        gpu_set_layout(
            gpu_id=gpu.pk, spec=LayoutSpec(mode="mig", instances=(MigInstanceSpec("1g.10gb", 0),))
        )
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"limit": {"mig_compute_slices": 14}})
    small = deployment_create(
        name="small",
        request=DeploymentRequest(kind="mig", profile="1g.10gb"),
        replicas=2,
        team_id=search.pk,
    )
    for gpu in gpus:
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"mig_compute_slices": 4})
    big = deployment_create(
        name="big",
        request=DeploymentRequest(kind="mig", profile="4g.40gb"),
        replicas=1,
        team_id=ads.pk,
    )

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return {"small": small, "big": big, "search": search, "ads": ads, "sync": sync}


def test_a_reclaim_moves_a_borrowed_replica_and_stops_nobody(lent_mig):
    webhook("https://hooks.example/r", [RECLAIM_STARTED, RECLAIM_FINISHED])
    started = reclaims_start()
    assert len(started) == 1
    operation = Operation.objects.get(pk=started[0])
    assert operation.kind == OperationKind.RECLAIM
    payload = operation.payload
    assert payload["action"] == "move" and payload["planned_stops"] == []
    assert payload["lender"]["name"] == "ads"
    assert [b["name"] for b in payload["borrowers"]] == ["search"]
    assert next(s["name"] for s in payload["plan"] if s["kind"] == "move").startswith("small[")
    assert "no smaller set" in payload["bound"]
    operation = run_reclaim(operation, lent_mig["sync"])
    assert operation.status == "succeeded", operation.payload["log"]
    assert operation.result["moved"] == 1 and operation.result["stopped"] == []
    placed = Allocation.objects.get(deployment=lent_mig["big"])
    assert placed.partition.profile_name == "4g.40gb" and not placed.borrowed
    # The borrower kept both its running replicas, still borrowed.
    small = Allocation.objects.placed().filter(deployment=lent_mig["small"])
    assert small.count() == 2 and all(a.borrowed for a in small)
    events = list(AlertDelivery.objects.order_by("pk").values_list("event", flat=True))
    assert events == [RECLAIM_STARTED, RECLAIM_FINISHED]
    finished = AlertDelivery.objects.get(event=RECLAIM_FINISHED).payload["subject"]
    assert finished["lender"]["name"] == "ads" and finished["stops"] == []


def test_a_reclaim_stops_a_borrowed_replica_only_when_no_move_would_do(lent_whole):
    before = Operation.objects.count()
    [pk] = reclaims_start()
    operation = Operation.objects.get(pk=pk)
    borrowed = lent_whole["borrowed"]
    assert operation.payload["action"] == "stop"
    assert [s["allocation"] for s in operation.payload["planned_stops"]] == [borrowed.pk]
    assert "whole-GPU replicas are not moved" in operation.payload["bound"]
    operation = run_reclaim(operation)
    assert operation.status == "succeeded", operation.payload["log"]
    serve = Allocation.objects.get(deployment=lent_whole["serve"])
    assert serve.gpu_id == borrowed.gpu_id and not serve.borrowed
    # The borrowed replica was evicted, not deleted: its deployment still wants 2, 1 waits.
    train = lent_whole["train"]
    train.refresh_from_db()
    assert train.replicas == 2
    assert Allocation.objects.placed().filter(deployment=train).count() == 1
    evicts = Operation.objects.filter(pk__gt=before, kind="evict", deployment=train)
    assert evicts.count() == 1
    assert operation.payload["claims"] == [{"deployment": train.pk, "gpus": [borrowed.gpu_id]}]
    # Nothing more to reclaim: train is past its deserved share, serve is placed.
    assert reclaims_start() == []


def test_no_net_gain_touches_nothing(lent_whole, settings):
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 3600  # the borrowed replica is too young to stop
    before = snapshot_rows()
    assert reclaims_start() == []
    with pytest.raises(Conflict) as refused:
        reclaim_start(deployment_id=lent_whole["serve"].pk)
    assert refused.value.code == "reclaim.no_gain"
    assert snapshot_rows() == before


def test_a_sweep_plans_an_ask_that_found_no_plan_once(lent_whole, settings, monkeypatch):
    # Three entitled claimants asking the same (a whole GPU, the same team): the borrowed
    # replica is too young to stop, so the first finds no plan, and the sweep does not plan
    # the same ask twice (the fleet only loses options within a sweep).
    import fleet.sharing.reclaiming as reclaiming

    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 3600
    for name in ("two", "three"):
        deployment_create(name=name, request=WHOLE, replicas=1, team_id=lent_whole["ads"].pk)
    planned = []
    real = reclaiming.reclaim_start

    def counted(**kwargs):
        planned.append(kwargs["deployment_id"])
        return real(**kwargs)

    monkeypatch.setattr(reclaiming, "reclaim_start", counted)
    team_quota_set(team_id=lent_whole["ads"].pk, quota={"gpus": 3})
    assert reclaims_start() == [] and len(planned) == 1


def test_a_replica_past_its_deserved_share_never_reclaims(lent_whole):
    with pytest.raises(Conflict) as refused:
        reclaim_start(deployment_id=lent_whole["train"].pk)
    assert refused.value.code == "reclaim.not_entitled"


def test_stops_only_if_still_needed(lent_whole):
    [pk] = reclaims_start()
    # Capacity comes back before the reclaim's first step: nobody is stopped.
    extra = GpuFactory(host=lent_whole["borrowed"].gpu.host)
    gpu_set_layout(gpu_id=extra.pk, spec=LayoutSpec(mode="dedicated"))
    operation = run_reclaim(Operation.objects.get(pk=pk))
    assert operation.status == "succeeded", operation.payload["log"]
    assert operation.result["stopped"] == []
    assert Allocation.objects.get(deployment=lent_whole["serve"]).gpu_id == extra.pk
    assert Allocation.objects.placed().filter(deployment=lent_whole["train"]).count() == 2
    assert any("nothing stopped" in e["note"] for e in operation.payload["log"])


def test_borrowers_to_be_at_the_head_of_the_queue_do_not_hide_an_entitled_claimant(lent_whole):
    # 25 waiting deployments of a team that only borrows (no deserved share: never entitled),
    # all waiting longer than *serve*: a sweep passes over them without counting them against
    # the plans it makes, and reaches *serve*.
    batch = team_create(name="batch")
    team_quota_set(team_id=batch.pk, quota={"limit": {"gpus": 4}})
    earlier = lent_whole["serve"].created_at - timedelta(hours=1)
    for n in range(25):
        d = deployment_create(name=f"batch-{n}", request=WHOLE, replicas=1, team_id=batch.pk)
        Deployment.objects.filter(pk=d.pk).update(created_at=earlier)
    [pk] = reclaims_start()
    assert Operation.objects.get(pk=pk).deployment_id == lent_whole["serve"].pk


def test_a_deployment_has_one_reclaim_at_a_time(lent_whole):
    [pk] = reclaims_start()
    assert reclaims_start() == []  # serve's runs; nobody else is entitled and waiting
    with pytest.raises(Conflict) as twice:
        reclaim_start(deployment_id=lent_whole["serve"].pk)
    assert twice.value.code == "reclaim.in_progress"
    assert Operation.objects.filter(kind=OperationKind.RECLAIM).count() == 1
    assert Operation.objects.get(pk=pk).payload["gpus"] == [lent_whole["borrowed"].gpu_id]


@pytest.fixture
def lent_four(settings):
    """Four whole GPUs held by *search* (deserved 1: three borrowed); *ads* (deserved 3) waits
    with three deployments of one replica each."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    return lend_whole_gpus(4, [f"serve-{n}" for n in range(3)])


def test_reclaims_run_side_by_side_each_on_its_own_gpus(lent_four):
    started = reclaims_start()
    assert len(started) == 3  # one sweep: ads's three replicas, reclaimed at once
    operations = list(Operation.objects.filter(pk__in=started).order_by("pk"))
    assert {op.deployment_id for op in operations} == {d.pk for d in lent_four["serves"]}
    stopped = [op.payload["planned_stops"][0]["allocation"] for op in operations]
    assert len(set(stopped)) == 3  # each stops a borrowed replica of its own
    gpus = [set(op.payload["gpus"]) for op in operations]
    assert all(not (a & b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]), gpus
    for operation in operations:
        assert run_reclaim(operation).status == "succeeded", operation.payload["log"]
    placed = Allocation.objects.placed().filter(deployment__in=lent_four["serves"])
    assert placed.count() == 3 and not any(a.borrowed for a in placed)
    # search keeps its deserved GPU; its three borrowed replicas wait in the queue.
    assert Allocation.objects.placed().filter(deployment=lent_four["train"]).count() == 1


def test_at_most_the_concurrency_limit_runs(lent_four, settings):
    settings.FLEET_RECLAIM_CONCURRENCY = 2
    assert len(reclaims_start()) == 2
    assert reclaims_start() == []  # two run: the third waits for one to end
    settings.FLEET_RECLAIM_CONCURRENCY = 1
    Operation.objects.filter(kind=OperationKind.RECLAIM).update(status="failed")
    Operation.objects.filter(kind=OperationKind.RECLAIM).update(
        finished_at=timezone.now() - timedelta(hours=1)
    )
    assert len(reclaims_start()) == 1


def test_a_plan_on_a_busy_gpu_is_refused(lent_four):
    [first, *_] = lent_four["serves"]
    busy = list(Allocation.objects.filter(borrowed=True).values_list("gpu_id", flat=True))
    before = snapshot_rows()
    with pytest.raises(Conflict) as refused:
        reclaim_start(deployment_id=first.pk, avoid_gpus=busy)
    # Planned away from them, nothing is left to stop: no net gain, nothing touched.
    assert refused.value.code == "reclaim.no_gain"
    assert snapshot_rows() == before


def test_a_reclaim_started_by_an_older_server_runs_alone(lent_four):
    [pk, *_] = reclaims_start()
    Operation.objects.filter(kind=OperationKind.RECLAIM).exclude(pk=pk).delete()
    operation = Operation.objects.get(pk=pk)
    operation.payload.pop("gpus")  # as an older server recorded it
    operation.save(update_fields=["payload"])
    assert reclaims_start() == []


def test_a_stopped_replica_is_not_placed_back_while_the_claim_holds(lent_whole):
    train, borrowed = lent_whole["train"], lent_whole["borrowed"]
    gpu = borrowed.gpu
    Allocation.objects.filter(pk=borrowed.pk).delete()  # as if a reclaim had stopped it
    # (nothing of ads waits now: borrowing alone would let train take the GPU back)
    Deployment.objects.filter(pk=lent_whole["serve"].pk).update(replicas=0)
    claim = operation_record(
        kind=OperationKind.RECLAIM,
        summary="a reclaim in progress",
        status="dispatched",
        payload={"claims": [{"deployment": train.pk, "gpus": [gpu.pk]}]},
    )
    before = snapshot_rows()
    with pytest.raises(RuleViolation) as refused:
        deployment_place(deployment_id=train.pk, gpu_id=gpu.pk)
    assert refused.value.code == "reclaim.claimed"
    with pytest.raises(RuleViolation) as auto:
        deployment_autoplace(deployment_id=train.pk, limit=1)
    assert "reclaim.claimed" in {v["code"] for v in auto.value.details["violations"]}
    assert snapshot_rows() == before
    Operation.objects.filter(pk=claim.pk).update(status="succeeded")
    deployment_place(deployment_id=train.pk, gpu_id=gpu.pk)  # the claim no longer holds


def test_the_team_pages_show_the_reclaim(lent_whole, admin_user, client):
    [pk] = reclaims_start()
    run_reclaim(Operation.objects.get(pk=pk))
    client.force_login(admin_user)
    for team in (lent_whole["search"], lent_whole["ads"]):
        page = client.get(f"/teams/{team.pk}/").content.decode()
        assert f'data-operation="{pk}"' in page and "Stopped train[" in page, team.name
        assert "Why no fewer: 1 stop(s)" in page


def test_a_stopped_mig_replica_leaves_its_slice_destroyed_for_the_claimant(
    django_capture_on_commit_callbacks, settings
):
    """x holds ads's 4g.40gb at 0 and 3g.40gb at 4 (full); y holds ads's 3g.40gb at 0 and
    search's borrowed 1g.10gb at 4. ads's next 3g.40gb fits only at y's back half: no move
    makes room (x is full), so the 1g is stopped, its slice destroyed, and the 3g created
    there."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb", "h100-sxm5-80gb"])
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    x, y = Gpu.objects.filter(host=host).order_by("index")
    layouts = {
        x.pk: (MigInstanceSpec("4g.40gb", 0), MigInstanceSpec("3g.40gb", 4)),
        y.pk: (MigInstanceSpec("3g.40gb", 0), MigInstanceSpec("1g.10gb", 4)),
    }
    for gpu_id, instances in layouts.items():
        gpu_set_layout(gpu_id=gpu_id, spec=LayoutSpec(mode="mig", instances=instances))
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"limit": {"mig_compute_slices": 14}})
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"mig_compute_slices": 14})

    def mig(name, profile, team):
        request = DeploymentRequest(kind="mig", profile=profile)
        return deployment_create(name=name, request=request, replicas=1, team_id=team.pk)

    for partition in Partition.objects.filter(gpu__host=host, kind="mig").order_by("pk"):
        owner = search if partition.profile_name == "1g.10gb" else ads
        d = mig(f"{owner.name}-{partition.pk}", partition.profile_name, owner)
        deployment_place(deployment_id=d.pk, partition_id=partition.pk)
    lent = Allocation.objects.get(borrowed=True)
    assert lent.gpu_id == y.pk
    last = mig("ads-last", "3g.40gb", ads)

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    [pk] = reclaims_start()
    operation = run_reclaim(Operation.objects.get(pk=pk), sync)
    assert operation.status == "succeeded", operation.payload["log"]
    assert operation.payload["action"] == "stop"
    assert [s["allocation"] for s in operation.payload["stopped"]] == [lent.pk]
    assert operation.payload["destroy"] == [lent.partition_id]
    assert not Partition.objects.filter(pk=lent.partition_id).exists()
    placed = Allocation.objects.get(deployment=last)
    assert (placed.gpu_id, placed.partition.start) == (y.pk, 4)
    assert not Allocation.objects.filter(deployment=lent.deployment).exists()


def mig_fleet(capture, layouts):
    """One simulated host of H100s in MIG mode, one per entry of ``layouts`` (``(profile,
    start)`` instances), and a ``sync`` that lets its agent apply and acknowledge."""
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb"] * len(layouts))
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    for gpu, layout in zip(gpus, layouts, strict=True):
        spec = LayoutSpec(mode="mig", instances=tuple(MigInstanceSpec(p, s) for p, s in layout))
        gpu_set_layout(gpu_id=gpu.pk, spec=spec)

    def sync():
        with capture(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    return gpus, sync


def place_in(deployment, gpu, start):
    partition = Partition.objects.get(gpu=gpu, start=start)
    deployment_place(deployment_id=deployment.pk, partition_id=partition.pk)


def mig_deployment(name, profile, replicas, team):
    return deployment_create(
        name=name,
        request=DeploymentRequest(kind="mig", profile=profile),
        replicas=replicas,
        team_id=team.pk,
    )


def test_where_borrowed_moves_make_no_room_a_guaranteed_replica_moves_and_nobody_stops(
    django_capture_on_commit_callbacks, settings
):
    """GPU 0: *search*'s guaranteed 1g.10gb at start 0; GPU 1: a guaranteed one at start 1 and a
    borrowed one at start 0. *ads* waits for a 4g.40gb (start 0): moving the borrowed replica
    alone leaves GPU 1 blocked, so the reclaim moves GPU 0's guaranteed replica (one move, make
    before break) instead of stopping the borrowed one."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    (first, second), sync = mig_fleet(
        django_capture_on_commit_callbacks,
        [[("1g.10gb", 0)], [("1g.10gb", 0), ("1g.10gb", 1)]],
    )
    search = team_create(name="search")
    team_quota_set(
        team_id=search.pk, quota={"mig_compute_slices": 2, "limit": {"mig_compute_slices": 14}}
    )
    small = mig_deployment("small", "1g.10gb", 3, search)
    for gpu, start in ((first, 0), (second, 1), (second, 0)):  # the third is borrowed
        place_in(small, gpu, start)
    assert Allocation.objects.get(borrowed=True).partition.gpu_id == second.pk
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"mig_compute_slices": 4})
    big = mig_deployment("big", "4g.40gb", 1, ads)
    sync()
    (started,) = reclaims_start()
    operation = Operation.objects.get(pk=started)
    payload = operation.payload
    assert payload["action"] == "move" and payload["planned_stops"] == []
    moves = [s for s in payload["plan"] if s["kind"] == "move"]
    assert [(m["name"], m["gpu"]) for m in moves] == [("small[0]", second.pk)]
    assert payload["borrowers"] == []  # a guaranteed replica moved: nobody borrowed from
    assert "1 of them not borrowed" in payload["bound"]
    operation = run_reclaim(operation, sync)
    assert operation.status == "succeeded", operation.payload["log"]
    placed = Allocation.objects.get(deployment=big)
    assert placed.partition.profile_name == "4g.40gb" and placed.partition.gpu_id == first.pk
    running = Allocation.objects.placed().filter(deployment=small)
    assert running.count() == 3 and running.filter(borrowed=True).count() == 1


def test_a_sweep_stops_planning_once_its_time_budget_is_spent(lent_whole, monkeypatch):
    # Two entitled claimants, each plan refused: with no time budget left after the first
    # plan, the sweep does not plan the second; with time, it plans both.
    import fleet.sharing.reclaiming as reclaiming

    lent_whole["serve"].delete()
    for name in ("one", "two"):
        deployment_create(name=name, request=WHOLE, replicas=1, team_id=lent_whole["ads"].pk)
    planned = []

    def counted(**kwargs):
        planned.append(kwargs["deployment_id"])
        raise Conflict("reclaim.gpus_busy", "not now", {})

    monkeypatch.setattr(reclaiming, "reclaim_start", counted)
    monkeypatch.setattr(reclaiming, "PLAN_BUDGET_S", 0.0)
    assert reclaims_start() == [] and len(planned) == 1
    monkeypatch.setattr(reclaiming, "PLAN_BUDGET_S", 60.0)
    planned.clear()
    assert reclaims_start() == [] and len(planned) == 2


def test_a_gpu_cleared_by_a_move_and_a_stop_takes_a_whole_gpu_claimant(
    django_capture_on_commit_callbacks, settings
):
    """*ads* waits for a 7g.80gb. GPU 0: *search*'s borrowed 4g.40gb and a guaranteed 1g.10gb;
    GPU 1: full of guaranteed replicas; GPU 2: a guaranteed 4g.40gb, slices 4-6 free. Neither
    moves nor stops alone clear a GPU: the reclaim moves GPU 0's 1g to GPU 2 (make before
    break), then stops the borrowed 4g, and the claimant takes GPU 0."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    (first, second, third), sync = mig_fleet(
        django_capture_on_commit_callbacks,
        [
            [("4g.40gb", 0), ("1g.10gb", 4)],
            [("4g.40gb", 0), ("3g.40gb", 4)],
            [("4g.40gb", 0)],
        ],
    )
    search = team_create(name="search")
    team_quota_set(
        team_id=search.pk, quota={"mig_compute_slices": 12, "limit": {"mig_compute_slices": 28}}
    )
    one = mig_deployment("one", "1g.10gb", 1, search)
    four = mig_deployment("four", "4g.40gb", 3, search)
    three = mig_deployment("three", "3g.40gb", 1, search)
    place_in(one, first, 4)
    place_in(four, second, 0)
    place_in(three, second, 4)
    place_in(four, third, 0)
    place_in(four, first, 0)  # past the deserved 12 slices: borrowed
    borrowed = Allocation.objects.get(borrowed=True)
    assert borrowed.partition.gpu_id == first.pk
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"mig_compute_slices": 7})
    whole = mig_deployment("whole", "7g.80gb", 1, ads)
    sync()
    (started,) = reclaims_start()
    operation = Operation.objects.get(pk=started)
    payload = operation.payload
    assert payload["action"] == "stop"
    assert [s["allocation"] for s in payload["planned_stops"]] == [borrowed.pk]
    moves = [s for s in payload["plan"] if s["kind"] == "move"]
    assert [(m["name"], m["gpu"]) for m in moves] == [("one[0]", third.pk)]
    assert "1 move(s)" in payload["bound"]
    operation = run_reclaim(operation, sync, rounds=12)
    assert operation.status == "succeeded", operation.payload["log"]
    placed = Allocation.objects.get(deployment=whole)
    assert placed.partition.profile_name == "7g.80gb" and placed.partition.gpu_id == first.pk
    assert Allocation.objects.placed().get(deployment=one).gpu_id == third.pk  # still running
    assert not Allocation.objects.placed().filter(pk=borrowed.pk).exists()  # stopped, waiting
    assert Deployment.objects.get(pk=four.pk).replicas == 3  # not deleted


def test_beside_another_reclaim_it_never_stops_what_moves_would_spare(lent_mig):
    # Planned away from the second GPU (another reclaim's), only a stop would place *big*;
    # on the whole fleet a move does: it waits for that GPU rather than stop anyone.
    first, second = Gpu.objects.order_by("index").values_list("pk", flat=True)
    before = snapshot_rows()
    with pytest.raises(Conflict) as refused:
        reclaim_start(deployment_id=lent_mig["big"].pk, avoid_gpus=[second])
    assert refused.value.code == "reclaim.gpus_busy"
    assert snapshot_rows() == before
    # Alone, it moves (and stops nobody).
    operation = reclaim_start(deployment_id=lent_mig["big"].pk)
    assert operation.payload["action"] == "move" and set(operation.payload["gpus"]) == {
        first,
        second,
    }


def test_a_sweep_keeps_away_from_the_gpus_a_running_defrag_touches(lent_mig):
    # big's reclaim moves a borrowed replica from one GPU to the other: with a defrag (the
    # engine's for the queue's head, say) working on the second, it waits for it to end.
    _, second = Gpu.objects.order_by("index").values_list("pk", flat=True)
    defrag = operation_record(
        kind=OperationKind.DEFRAG,
        summary="a defrag",
        deployment=lent_mig["small"],
        status="dispatched",
        payload={"gpus": [second]},
    )
    before = snapshot_rows()
    assert reclaims_start() == []
    assert snapshot_rows() == before
    Operation.objects.filter(pk=defrag.pk).update(status="succeeded")
    [pk] = reclaims_start()
    assert Operation.objects.get(pk=pk).payload["action"] == "move"


def test_its_stops_wait_while_another_reclaim_holds_the_gpu_they_free(lent_whole):
    [pk] = reclaims_start()
    gpu = lent_whole["borrowed"].gpu_id
    # Another reclaim (of another claimant) comes to work on that GPU meanwhile.
    other = operation_record(
        kind=OperationKind.RECLAIM,
        summary="another reclaim",
        deployment=lent_whole["train"],
        status="dispatched",
        payload={"gpus": [gpu]},
    )
    operation = run_reclaim(Operation.objects.get(pk=pk), rounds=2)
    assert operation.status == "dispatched"  # waiting, nothing stopped
    assert Allocation.objects.placed().filter(deployment=lent_whole["train"]).count() == 2
    assert any("waiting for the other reclaims" in e["note"] for e in operation.payload["log"])
    Operation.objects.filter(pk=other.pk).update(status="succeeded")
    operation = run_reclaim(operation)
    assert operation.status == "succeeded", operation.payload["log"]
    assert operation.result["stopped"] == [lent_whole["borrowed"].pk]
