"""``GET /api/v1/allocations/{id}/what-would-it-take``: the ranked plans that would place a
waiting replica, each the exact requests that apply it; applied, the top plan places it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache

from fleet.allocations.models import Allocation
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_delete,
    deployment_evict,
    deployment_place,
)
from fleet.core.models import Operation
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.sharing.wit import cached_answer, waiting_deployments, wit_refresh
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows
from tests.sharing.conftest import lend_whole_gpus, run_reclaim

pytestmark = pytest.mark.django_db

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()
    yield
    cache.clear()


def wit(client: Any, ref: str) -> Any:
    return client.get(f"/api/v1/allocations/{ref}/what-would-it-take")


def send(client: Any, request: dict[str, Any]) -> Any:
    """One request of a plan, exactly as the plan gives it."""
    path = "/api/v1" + request["path"]
    method = getattr(client, request["method"].lower())
    if request["body"] is None:
        return method(path)
    return method(path, request["body"], format="json")


def dedicated_gpus(n: int, host: Any = None) -> list[Any]:
    host = host or HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(n)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    return gpus


@pytest.fixture
def lent_fleet(settings):
    """Two GPUs, both held by *search* (one borrowed); *ads* (deserved 1) waits."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    gpus = dedicated_gpus(2)
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"gpus": 1, "limit": {"gpus": 2}})
    train = deployment_create(name="train", request=WHOLE, replicas=2, team_id=search.pk)
    for gpu in gpus:
        deployment_place(deployment_id=train.pk, gpu_id=gpu.pk)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"gpus": 1})
    serve = deployment_create(name="serve", request=WHOLE, replicas=1, team_id=ads.pk)
    return {"serve": serve, "train": train, "borrowed": Allocation.objects.get(borrowed=True)}


def test_stopping_borrowed_work_is_the_plan_and_reading_changes_nothing(
    viewer_client, operator_client, lent_fleet
):
    serve, borrowed = lent_fleet["serve"], lent_fleet["borrowed"]
    before = snapshot_rows()
    response = wit(viewer_client, f"{serve.pk}.0")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert snapshot_rows() == before
    assert (body["id"], body["blocked_by"]) == (f"{serve.pk}.0", "capacity")
    kinds = [p["kind"] for p in body["plans"]]
    assert kinds == ["stop", "wait"]
    stop = body["plans"][0]
    assert stop["rank"] == 1 and stop["stopped"] == 1 and stop["destructive"]
    # Applied as the reclaim itself, planned again when it is sent (never a stale list of
    # evictions); the replicas it would stop now are named in the details.
    assert stop["requests"] == [
        {"method": "POST", "path": f"/queue/reclaim/{serve.pk}", "body": None, "after": ""}
    ]
    assert stop["details"]["stops"] == [
        {
            "allocation": borrowed.pk,
            "deployment": borrowed.deployment_id,
            "replica": borrowed.replica,
            "gpu": borrowed.gpu_id,
        }
    ]
    assert stop["role"] == "operator" and stop["may_apply"] is False  # a viewer
    assert wit(operator_client, f"{serve.pk}.0").json()["plans"][0]["may_apply"] is True
    wait = body["plans"][-1]
    assert wait["details"]["when"] == "unknown" and wait["details"]["at"] is None
    assert wait["requests"] == [] and wait["may_apply"] is False


def test_no_stop_plan_where_the_teams_replicas_ahead_in_the_queue_take_its_share_first(
    viewer_client, lent_fleet
):
    # ads deserves one GPU and holds none: serve, waiting first, is entitled and gets the
    # reclaim. Later, a second deployment of ads is entitled alone too, but the sweep serves
    # serve first, after which ads is at its share: a reclaim sent for it would be refused
    # (reclaim.not_entitled), so it is not offered one.
    serve = lent_fleet["serve"]
    later = deployment_create(name="later", request=WHOLE, replicas=1, team_id=serve.team_id)
    assert [p["kind"] for p in wit(viewer_client, f"{serve.pk}.0").json()["plans"]] == [
        "stop",
        "wait",
    ]
    body = wit(viewer_client, f"{later.pk}.0").json()
    assert [p["kind"] for p in body["plans"]] == ["wait"], body
    deployment_delete(deployment_id=serve.pk)  # nothing of ads waits before later now
    cache.clear()
    body = wit(viewer_client, f"{later.pk}.0").json()
    assert [p["kind"] for p in body["plans"]] == ["stop", "wait"], body


def test_the_stop_plan_is_planned_again_when_applied_and_places_the_replica(
    operator_client, settings
):
    # Three GPUs held by search (two borrowed). The answer names the most recently started
    # borrowed replica; before it is applied, that replica is evicted and a third team takes
    # its GPU. Applied, the plan (the reclaim itself) stops the other borrowed one instead and
    # places the replica: the evictions it listed would now fail.

    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    lent = lend_whole_gpus(3, ["serve"])
    serve, train = lent["serves"][0], lent["train"]
    stop = wit(operator_client, f"{serve.pk}.0").json()["plans"][0]
    assert stop["kind"] == "stop" and stop["may_apply"] is True
    [named] = stop["details"]["stops"]
    deployment_evict(deployment_id=train.pk, replica=named["replica"])
    ops = team_create(name="ops")
    team_quota_set(team_id=ops.pk, quota={"gpus": 1})
    taker = deployment_create(name="taker", request=WHOLE, replicas=1, team_id=ops.pk)
    deployment_place(deployment_id=taker.pk, gpu_id=named["gpu"])
    [request] = stop["requests"]
    response = send(operator_client, request)
    assert response.status_code == 202, response.json()
    operation = Operation.objects.get(pk=response.json()["id"])
    operation = run_reclaim(operation)
    assert operation.status == "succeeded", operation.payload["log"]
    placed = Allocation.objects.get(deployment=serve)
    assert placed.gpu_id != named["gpu"] and not placed.borrowed
    assert Allocation.objects.placed().filter(deployment=taker, gpu_id=named["gpu"]).exists()


def test_a_quota_block_answers_the_exact_quota_body_and_applying_it_places_the_replica(
    admin_client, viewer_client
):
    first, _ = dedicated_gpus(2)
    team = team_create(name="ads")
    team_quota_set(team_id=team.pk, quota={"gpus": 1})
    serve = deployment_create(name="serve", request=WHOLE, replicas=2, team_id=team.pk)
    deployment_place(deployment_id=serve.pk, gpu_id=first.pk)
    body = wit(viewer_client, f"{serve.pk}.1").json()
    assert body["blocked_by"] == "quota"
    assert body["quota_reasons"][0]["code"] == "quota.exceeded"
    top = body["plans"][0]
    assert top["kind"] == "quota" and top["role"] == "admin" and top["changes_policy"]
    assert top["requests"][0] == {
        "method": "PUT",
        "path": f"/teams/{team.pk}/quota",
        "body": {"gpus": 2},
        "after": "",
    }
    assert top["may_apply"] is False
    admin_plan = wit(admin_client, f"{serve.pk}.1").json()["plans"][0]
    assert admin_plan["may_apply"] is True
    for request in admin_plan["requests"]:
        assert send(admin_client, request).status_code < 300
    assert Allocation.objects.placed().filter(deployment=serve).count() == 2
    assert_error(wit(viewer_client, f"{serve.pk}.1"), 409, "wit.placed")


def test_an_engine_placed_replicas_quota_plan_is_the_change_alone(admin_client, viewer_client):
    # No explicit target to lose to another replica meanwhile: the change lets it in and the
    # engine places it wherever it fits then.
    from fleet.sharing.placing import queue_place

    first, _ = dedicated_gpus(2)
    team = team_create(name="ads")
    team_quota_set(team_id=team.pk, quota={"gpus": 1})
    serve = deployment_create(name="serve", request=WHOLE, replicas=1, team_id=team.pk)
    deployment_place(deployment_id=serve.pk, gpu_id=first.pk)
    serve.auto_place = True
    serve.replicas = 2
    serve.save(update_fields=["auto_place", "replicas"])
    top = wit(admin_client, f"{serve.pk}.1").json()["plans"][0]
    assert top["kind"] == "quota" and top["summary"].endswith("then the engine places it.")
    [put] = top["requests"]
    assert put["method"] == "PUT" and put["path"] == f"/teams/{team.pk}/quota"
    assert send(admin_client, put).status_code == 200
    queue_place()  # what the change kicks (beat's run in the embedded mode)
    assert Allocation.objects.placed().filter(deployment=serve).count() == 2


def test_a_replica_that_fits_now_is_placed_by_its_one_plan(operator_client):
    (gpu,) = dedicated_gpus(1)
    serve = deployment_create(name="serve", request=WHOLE, replicas=1)
    body = wit(operator_client, f"{serve.pk}.0").json()
    assert body["blocked_by"] == "none"
    assert [p["kind"] for p in body["plans"]] == ["place", "wait"]
    place = body["plans"][0]
    assert place["requests"] == [
        {
            "method": "POST",
            "path": f"/deployments/{serve.pk}/place",
            "body": {"gpu": gpu.pk},
            "after": "",
        }
    ]
    assert send(operator_client, place["requests"][0]).status_code == 202
    assert Allocation.objects.placed().filter(deployment=serve).count() == 1


def test_an_engine_placed_replica_that_fits_kicks_the_queue_and_others_do_not(
    operator_client, broker, django_capture_on_commit_callbacks
):
    from fleet.allocations.models import Deployment
    from fleet.core.jobs import PLACE_QUEUE

    dedicated_gpus(1)
    manual = deployment_create(name="manual", request=WHOLE, replicas=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert wit(operator_client, f"{manual.pk}.0").json()["blocked_by"] == "none"
    assert PLACE_QUEUE not in broker  # placing it is the operator's: the plan says so
    Deployment.objects.filter(pk=manual.pk).update(auto_place=True)  # left waiting (a race)
    cache.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert wit(operator_client, f"{manual.pk}.0").json()["plans"][0]["kind"] == "place"
    assert broker == [PLACE_QUEUE]  # the engine's: the queue runs at once
    cache.clear()  # the answer and the once-a-second hold gone
    with django_capture_on_commit_callbacks(execute=True):
        assert wit_refresh().computed == 1
    # Beat's refresh runs the queue itself, at once: no kick held back a second, in which an
    # arrival could take the room the answer names.
    assert broker.count(PLACE_QUEUE) == 1  # the first kick's, from the on-demand answer
    assert Allocation.objects.filter(deployment=manual).count() == 1  # placed, and pushed:
    assert broker[-1] == "fleet.push_desired_state"


def test_a_refresh_whose_queue_run_finds_another_run_going_kicks_the_queue(
    broker, django_capture_on_commit_callbacks, monkeypatch
):
    # Another worker's run holds the queue (PostgreSQL's advisory lock): the refresh's own run
    # places nothing, and the kick makes sure a run comes after that one.
    from fleet.core.jobs import PLACE_QUEUE
    from fleet.sharing import wit as wit_module

    dedicated_gpus(1)
    deployment_create(name="engine", request=WHOLE, replicas=1, auto_place=True)
    Allocation.objects.all().delete()
    runs: list[str] = []
    monkeypatch.setattr(wit_module, "queue_place_unless_busy", lambda: runs.append("busy"))
    with django_capture_on_commit_callbacks(execute=True):
        assert wit_refresh().computed == 1
    assert runs == ["busy"] and broker == [PLACE_QUEUE]


def test_a_refresh_answers_on_the_fleet_its_own_queue_run_left(
    broker, django_capture_on_commit_callbacks
):
    # One free GPU, two engine-placed deployments: the refresh finds the first fitting and
    # the queue places it at once; the second is then answered on the fleet as it is now
    # (its answer under the fleet's new fingerprint, readable), and the fleet is not marked
    # done: the answer before the run was on the fleet before.

    from fleet.allocations.models import Deployment
    from fleet.sharing.wit import CACHE_PREFIX, fleet_fingerprint

    dedicated_gpus(1)
    first = deployment_create(name="first", request=WHOLE, replicas=1, auto_place=True)
    second = deployment_create(name="second", request=WHOLE, replicas=1, auto_place=True)
    Deployment.objects.filter(pk=first.pk).update(
        created_at=first.created_at - timedelta(minutes=5)
    )
    Allocation.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        refresh = wit_refresh()
    assert refresh.computed == 2
    assert Allocation.objects.filter(deployment=first).count() == 1
    now = fleet_fingerprint()
    assert refresh.fingerprint == now
    answer = cached_answer(now, second.pk)
    assert answer is not None and answer["blocked_by"] == "capacity"
    assert cache.get(f"{CACHE_PREFIX}:done:{now}") is None


def test_the_room_the_queues_replicas_ahead_take_is_not_promised_again(viewer_client, monkeypatch):
    # One free GPU, two engine-placed deployments waiting for one: each fits alone, but the
    # queue places the first there; the second's answer says it does not fit, from the
    # background refresh (one context: another worker's queue run holds the queue) and on
    # demand alike.

    from fleet.allocations.models import Deployment
    from fleet.sharing import wit as wit_module

    monkeypatch.setattr(wit_module, "queue_place_unless_busy", lambda: None)

    dedicated_gpus(1)
    first = deployment_create(name="first", request=WHOLE, replicas=1, auto_place=True)
    second = deployment_create(name="second", request=WHOLE, replicas=1, auto_place=True)
    Deployment.objects.filter(pk=first.pk).update(
        created_at=first.created_at - timedelta(minutes=5)
    )
    assert Allocation.objects.count() == 0
    assert wit(viewer_client, f"{first.pk}.0").json()["plans"][0]["kind"] == "place"
    body = wit(viewer_client, f"{second.pk}.0").json()
    assert body["blocked_by"] == "capacity"
    assert "place" not in [p["kind"] for p in body["plans"]]
    cache.clear()
    assert wit_refresh().computed == 2
    fingerprint = body["fingerprint"]
    assert cached_answer(fingerprint, first.pk)["blocked_by"] == "none"
    assert cached_answer(fingerprint, second.pk)["blocked_by"] == "capacity"


def test_a_borrowing_the_queues_replicas_ahead_leave_refused_is_not_promised(viewer_client):
    # Four GPUs, one held by lab. ads deserves two and waits for two (its operators place
    # them). c and e only borrow; each waits for one GPU, engine-placed, c first. Alone, e may
    # borrow (3 free - 1 leaves the 2 ads needs); once the queue has placed c, it may not (2
    # free - 1 < 2): its answer is not "place", and the queue's run indeed leaves it waiting.

    from fleet.allocations.models import Deployment
    from fleet.sharing.placing import queue_place

    gpus = dedicated_gpus(4)
    lab = deployment_create(name="lab", request=WHOLE, replicas=1)
    deployment_place(deployment_id=lab.pk, gpu_id=gpus[0].pk)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"gpus": 2})
    deployment_create(name="serve", request=WHOLE, replicas=2, team_id=ads.pk)
    made = {}
    for name in ("c", "e"):
        team = team_create(name=name)
        team_quota_set(team_id=team.pk, quota={"limit": {"gpus": 4}})
        made[name] = deployment_create(
            name=f"{name}-job", request=WHOLE, replicas=1, team_id=team.pk, auto_place=True
        )
    c, e = made["c"], made["e"]
    Deployment.objects.filter(pk=c.pk).update(created_at=c.created_at - timedelta(minutes=5))
    assert wit(viewer_client, f"{c.pk}.0").json()["plans"][0]["kind"] == "place"
    body = wit(viewer_client, f"{e.pk}.0").json()
    assert body["blocked_by"] == "quota", body
    assert [r["code"] for r in body["quota_reasons"]] == ["quota.borrow_unavailable"]
    assert "place" not in [p["kind"] for p in body["plans"]]
    deployment_delete(deployment_id=c.pk)  # nothing borrows ahead of e now: it may
    cache.clear()
    assert wit(viewer_client, f"{e.pk}.0").json()["plans"][0]["kind"] == "place"
    c = deployment_create(
        name="c-job2", request=WHOLE, replicas=1, team_id=c.team_id, auto_place=True
    )
    Deployment.objects.filter(pk=c.pk).update(created_at=c.created_at - timedelta(minutes=9))
    queue_place()
    placed = set(Allocation.objects.values_list("deployment_id", flat=True))
    assert c.pk in placed and e.pk not in placed  # what the answer said


@pytest.mark.parametrize("free", [1, 2])
def test_a_quota_plan_counts_its_teams_replicas_ahead_that_the_change_lets_in_first(
    viewer_client, free
):
    # ads may hold one GPU and holds it; two of its engine-placed deployments wait, first
    # ahead. Raising the quota lets first in too, and the queue places it first: second is
    # promised only the room first leaves, and its change covers both (it was told "raise to
    # 2, then the engine places it", which would place first instead).
    from fleet.allocations.models import Deployment

    gpus = dedicated_gpus(1 + free)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"gpus": 1})
    held = deployment_create(name="held", request=WHOLE, replicas=1, team_id=ads.pk)
    deployment_place(deployment_id=held.pk, gpu_id=gpus[0].pk)
    first, second = (
        deployment_create(name=n, request=WHOLE, replicas=1, team_id=ads.pk, auto_place=True)
        for n in ("first", "second")
    )
    Deployment.objects.filter(pk=first.pk).update(
        created_at=first.created_at - timedelta(minutes=5)
    )
    top = wit(viewer_client, f"{first.pk}.0").json()["plans"][0]
    assert top["kind"] == "quota" and top["requests"][0]["body"] == {"gpus": 2}
    body = wit(viewer_client, f"{second.pk}.0").json()
    assert body["blocked_by"] == "quota"
    kinds = [p["kind"] for p in body["plans"]]
    if free == 1:  # first takes the one free GPU: no change places second
        assert "quota" not in kinds, body["plans"]
    else:
        assert body["plans"][0]["kind"] == "quota"
        assert body["plans"][0]["requests"][0]["body"] == {"gpus": 3}


def test_a_quota_plan_is_promised_only_the_room_the_queues_run_leaves_before_the_change(
    operator_client, viewer_client
):
    # ads may hold one 7g.80gb and holds it; first (a 7g) waits on its quota, later (a 1g, no
    # limit on that profile) waits behind it. An admin's change lands after the queue's next
    # run, which passes over first and places later on the one empty GPU: no quota change
    # places first there (it was told "raise it, then the engine places it").
    from fleet.allocations.models import Deployment
    from fleet.sharing.placing import queue_place

    host = HostFactory()
    full, empty = (GpuFactory(host=host, product_key="h100-sxm5-80gb") for _ in range(2))
    for gpu in (full, empty):
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mig"))
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"mig_profiles": {"7g.80gb": 1}})
    held = deployment_create(name="held", request=BIG, replicas=1, team_id=ads.pk)
    deployment_place(deployment_id=held.pk, gpu_id=full.pk)
    first = deployment_create(
        name="first", request=BIG, replicas=1, team_id=ads.pk, auto_place=True
    )
    small = DeploymentRequest(kind="mig", profile="1g.10gb")
    later = deployment_create(
        name="later", request=small, replicas=1, team_id=ads.pk, auto_place=True
    )
    Deployment.objects.filter(pk=first.pk).update(
        created_at=first.created_at - timedelta(minutes=5)
    )
    body = wit(viewer_client, f"{first.pk}.0").json()
    assert body["blocked_by"] == "quota"
    assert "quota" not in [p["kind"] for p in body["plans"]], body["plans"]
    queue_place()  # what the answer counted on
    assert Allocation.objects.get(deployment=later).gpu_id == empty.pk


def test_k_moves_carry_the_planners_proof_and_apply_as_a_defrag(operator_client, viewer_client):
    host = HostFactory()
    gpus = [GpuFactory(host=host, product_key="h100-sxm5-80gb") for _ in range(2)]
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=2
    )
    for gpu in gpus:  # a 1g busy in the middle of each grid: no 7g fits anywhere
        operator_client.put(
            f"/api/v1/gpus/{gpu.pk}/layout",
            {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 3}]},
            format="json",
        )
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)
    big = deployment_create(
        name="big", request=DeploymentRequest(kind="mig", profile="7g.80gb"), replicas=1
    )
    body = wit(viewer_client, f"{big.pk}.0").json()
    moves = next(p for p in body["plans"] if p["kind"] == "moves")
    assert moves["moved"] == 1 and moves["proof"]["bound"] == 1
    assert moves["proof"]["method"] == "exhaustive"
    assert moves["requests"] == [
        {"method": "POST", "path": f"/deployments/{big.pk}/defrag", "body": None, "after": ""}
    ]
    assert body["plans"][0]["kind"] == "moves"  # one move beats any reshape or stop
    assert body["plans"][-1]["kind"] == "wait"


def fragmented_fleet(client: Any, gpus: int = 2) -> list[Any]:
    """H100s whose grids each hold one busy 1g in the middle: no 7g fits, one move frees one."""
    host = HostFactory()
    made = [GpuFactory(host=host, product_key="h100-sxm5-80gb") for _ in range(gpus)]
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=gpus
    )
    for gpu in made:
        client.put(
            f"/api/v1/gpus/{gpu.pk}/layout",
            {"mode": "mig", "instances": [{"profile": "1g.10gb", "start": 3}]},
            format="json",
        )
        deployment_place(deployment_id=small.pk, partition_id=Partition.objects.get(gpu=gpu).pk)
    return made


BIG = DeploymentRequest(kind="mig", profile="7g.80gb")


def defrags() -> list[Operation]:
    return list(Operation.objects.filter(kind="defrag").order_by("pk"))


def test_the_refresh_carries_out_the_moves_of_the_queues_head_and_promises_its_room_to_none(
    operator_client,
):
    # FLEET_QUEUE_DEFRAG: the first engine-placed replica waiting for capacity, whose top plan
    # is moves, is defragmented for by the engine. The next one, asking the same, is answered
    # on the fleet those moves and its placement leave: the one GPU they free is not offered
    # to it too (it was, before: both got the same plan and the second would fail).

    from fleet.allocations.models import Deployment

    fragmented_fleet(operator_client)
    head = deployment_create(name="head", request=BIG, replicas=1, auto_place=True)
    behind = deployment_create(name="behind", request=BIG, replicas=1, auto_place=True)
    Deployment.objects.filter(pk=head.pk).update(created_at=head.created_at - timedelta(minutes=5))
    refresh = wit_refresh()
    assert refresh.computed == 2
    [operation] = defrags()
    assert operation.deployment_id == head.pk and operation.requested_by is None
    assert [step["kind"] for step in operation.payload["plan"]] == ["move"]
    assert cached_answer(refresh.fingerprint, head.pk)["plans"][0]["kind"] == "moves"
    answer = cached_answer(refresh.fingerprint, behind.pk)
    assert "moves" not in [p["kind"] for p in answer["plans"]], answer["plans"]
    wit_refresh()  # one engine defrag at a time: none for the replica behind
    assert len(defrags()) == 1
    # Read meanwhile, the head's answer says Fleet is placing it (nothing to apply).
    assert wit(operator_client, f"{head.pk}.0").json()["in_progress"] == {
        "operation": operation.pk,
        "kind": "defrag",
        "requested_by": None,
    }
    assert wit(operator_client, f"{behind.pk}.0").json()["in_progress"] is None


def test_each_replica_ahead_is_promised_its_own_moves_and_no_room_twice(operator_client):
    # Three engine-placed 7g replicas wait on three fragmented H100s; read on demand (nothing
    # is carried out). Each is answered on the fleet the moves of the ones ahead and their
    # placement leave: the first and second are given moves for two different GPUs, the third
    # none (before, all three were told to apply one defrag for the same GPU).
    from fleet.allocations.models import Deployment

    fragmented_fleet(operator_client, gpus=3)
    made = [deployment_create(name=n, request=BIG, replicas=1, auto_place=True) for n in "abc"]
    for age, deployment in enumerate(reversed(made)):  # a first in the queue, then b, then c
        Deployment.objects.filter(pk=deployment.pk).update(
            created_at=deployment.created_at - timedelta(minutes=age + 1)
        )
    answers = [wit(operator_client, f"{d.pk}.0").json() for d in made]
    first, second, third = ([p["kind"] for p in a["plans"]] for a in answers)
    assert first[0] == second[0] == "moves", (first, second)
    targets = [a["plans"][0]["details"]["target_gpu"] for a in answers[:2]]
    assert targets[0] != targets[1]
    assert "moves" not in third, third
    assert defrags() == []


def test_an_answer_read_on_demand_is_carried_out_by_the_next_refresh(operator_client):
    # The head's answer computed by a reader first: the refresh finds it cached for this fleet
    # and still carries out its moves (not a minute later, when it would compute it again).
    fragmented_fleet(operator_client)
    big = deployment_create(name="big", request=BIG, replicas=1, auto_place=True)
    assert wit(operator_client, f"{big.pk}.0").json()["plans"][0]["kind"] == "moves"
    assert defrags() == []  # reading changes nothing
    assert wit_refresh().computed == 0  # nothing recomputed
    assert [op.deployment_id for op in defrags()] == [big.pk]


def test_no_engine_defrag_behind_a_replica_waiting_for_capacity_nor_when_turned_off(
    operator_client, settings
):

    from fleet.allocations.models import Deployment

    fragmented_fleet(operator_client)
    whole = deployment_create(name="whole", request=WHOLE, replicas=1, auto_place=True)
    big = deployment_create(name="big", request=BIG, replicas=1, auto_place=True)
    Deployment.objects.filter(pk=whole.pk).update(
        created_at=whole.created_at - timedelta(minutes=5)
    )
    refresh = wit_refresh()  # a whole GPU waits at the head: the queue is not big's to lead
    assert cached_answer(refresh.fingerprint, big.pk)["plans"][0]["kind"] == "moves"
    assert defrags() == []
    deployment_delete(deployment_id=whole.pk)
    manual = deployment_create(name="manual", request=BIG, replicas=1)  # an operator places it
    Deployment.objects.filter(pk=manual.pk).update(
        created_at=manual.created_at - timedelta(minutes=9)
    )
    settings.FLEET_QUEUE_DEFRAG = False
    cache.clear()
    wit_refresh()
    assert defrags() == []
    settings.FLEET_QUEUE_DEFRAG = True
    cache.clear()
    wit_refresh()  # the manual one is the operator's to apply; big, behind it, is the head
    assert [op.deployment_id for op in defrags()] == [big.pk]


def test_no_engine_defrag_again_soon_after_one_failed_nor_on_a_reclaims_gpus(operator_client):
    from django.utils import timezone

    from fleet.core.models import OperationKind, OperationStatus
    from fleet.core.operations import operation_record

    gpus = fragmented_fleet(operator_client)
    big = deployment_create(name="big", request=BIG, replicas=1, auto_place=True)
    failed = operation_record(
        kind=OperationKind.DEFRAG,
        summary="an earlier defrag",
        deployment=big,
        status=OperationStatus.FAILED,
        payload={"plan": [], "index": 0, "step": "failed", "log": []},
    )
    Operation.objects.filter(pk=failed.pk).update(finished_at=timezone.now())
    wit_refresh()
    assert defrags() == [failed]  # its last one failed a moment ago: not again yet
    Operation.objects.filter(pk=failed.pk).update(finished_at=timezone.now() - timedelta(minutes=5))
    reclaim = operation_record(  # a running reclaim touches both GPUs
        kind=OperationKind.RECLAIM,
        summary="a reclaim",
        status=OperationStatus.DISPATCHED,
        payload={"gpus": [g.pk for g in gpus], "log": []},
    )
    cache.clear()
    wit_refresh()
    assert defrags() == [failed]
    Operation.objects.filter(pk=reclaim.pk).update(status=OperationStatus.SUCCEEDED)
    cache.clear()
    wit_refresh()
    assert [op.deployment_id for op in defrags()] == [big.pk, big.pk]


@pytest.mark.parametrize(
    "ref", ["abc", "999999.0", "1.2.3", "-1", "999999", "999999.next", "²", "1.²", "١٢"]
)
def test_bad_ids_are_404(viewer_client, ref):
    assert_error(wit(viewer_client, ref), 404, "replica.not_found")


def test_next_names_the_first_waiting_replica_and_is_409_when_none_waits(viewer_client):
    (gpu,) = dedicated_gpus(1)
    serve = deployment_create(name="serve", request=WHOLE, replicas=2)
    deployment_place(deployment_id=serve.pk, gpu_id=gpu.pk)
    body = wit(viewer_client, f"{serve.pk}.next").json()
    assert (body["id"], body["replica"]) == (f"{serve.pk}.1", 1)
    alone = deployment_create(name="alone", request=WHOLE, replicas=0)
    assert_error(wit(viewer_client, f"{alone.pk}.next"), 409, "wit.placed")


def test_a_replica_number_past_the_deployment_is_404(viewer_client):
    serve = deployment_create(name="serve", request=WHOLE, replicas=1)
    assert_error(wit(viewer_client, f"{serve.pk}.1"), 404, "replica.not_found")


def test_a_placed_replica_is_409_by_allocation_and_by_replica(viewer_client):
    (gpu,) = dedicated_gpus(1)
    serve = deployment_create(name="serve", request=WHOLE, replicas=1)
    deployment_place(deployment_id=serve.pk, gpu_id=gpu.pk)
    allocation = Allocation.objects.get(deployment=serve)
    for ref in (str(allocation.pk), f"{serve.pk}.0"):
        error = assert_error(wit(viewer_client, ref), 409, "wit.placed")
        assert error["details"]["allocation"] == allocation.pk


def test_anonymous_callers_are_refused(anon_client):
    assert wit(anon_client, "1.0").status_code in (401, 403)


def test_the_background_refresh_answers_every_waiting_replica_from_the_cache(
    viewer_client, lent_fleet
):
    refresh = wit_refresh()
    assert not refresh.skipped and refresh.computed == len(waiting_deployments()) == 1
    assert wit_refresh().skipped  # nothing changed: nothing recomputed
    body = wit(viewer_client, f"{lent_fleet['serve'].pk}.0").json()
    assert body["cached"] is True and body["fingerprint"] == refresh.fingerprint


def test_a_refresh_past_its_time_budget_stops_and_the_next_goes_on_oldest_first(
    lent_fleet, settings
):
    for n in range(2):
        deployment_create(
            name=f"more-{n}", request=WHOLE, replicas=1, team_id=lent_fleet["serve"].team_id
        )
    waiting = {d.pk for d in waiting_deployments()}
    assert len(waiting) == 3
    settings.FLEET_WIT_REFRESH_BUDGET_S = 0  # one answer a run, then it stops
    first = wit_refresh()
    assert first.computed == 1 and not first.skipped
    second, third = wit_refresh(), wit_refresh()
    assert (second.computed, third.computed) == (1, 1)  # not done: each run goes on
    assert wit_refresh().skipped  # every deployment answered for this fleet: done
    fingerprint = first.fingerprint
    assert all(cached_answer(fingerprint, pk) for pk in waiting)


def test_a_placement_change_makes_the_cached_answer_stale(viewer_client, lent_fleet):
    serve = lent_fleet["serve"]
    wit_refresh()
    assert wit(viewer_client, f"{serve.pk}.0").json()["cached"] is True
    Allocation.objects.filter(pk=lent_fleet["borrowed"].pk).delete()  # a GPU frees
    body = wit(viewer_client, f"{serve.pk}.0").json()
    assert body["cached"] is False and body["plans"][0]["kind"] == "place"
