"""The tray says what fits now of each deployment's unplaced replicas, where, and why not."""

from __future__ import annotations

import re
import time

import pytest
from django.db import transaction

from fleet.allocations.autoplace import deployment_place_all
from fleet.allocations.models import Deployment
from fleet.allocations.rankings import FitNow, deployments_fit_now
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.commands.demo_fleet import seed_demo_fleet
from fleet.core.errors import ServiceError
from fleet.domain import Violation
from fleet.inventory.models import Host
from fleet.mig import Instance
from fleet.partitioning.models import Partition
from fleet.placement import Target
from fleet.web.tray import TrayFit, target_words, tray_fit
from tests.web.seed import seed_fleet

pytestmark = pytest.mark.django_db


def sections(html: str) -> dict[str, str]:
    """The tray's groups by heading: "Unplaced, fits now", "Waiting, no capacity", "Placed"
    (a status without deployments has none)."""
    parts = re.split(r'<h3 data-section="\w+">(.*?) <span class="count">\d+</span></h3>', html)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def card(html: str, name: str) -> str:
    match = re.search(rf'<article [^>]*data-name="{re.escape(name)}".*?</article>', html, re.S)
    assert match, name
    return match.group(0)


def create(name: str, replicas: int, *, kind: str = "mig", **request: object) -> Deployment:
    return deployment_create(
        name=name, request=DeploymentRequest(kind=kind, **request), replicas=replicas
    )


@pytest.mark.parametrize(
    ("fit", "label"),
    [
        (TrayFit(6, 4), "4 of 6 fit now"),
        (TrayFit(3, 3), "all 3 fit now"),
        (TrayFit(1, 1), "fits now"),
        (TrayFit(500, 32, capped=True), "32+ of 500 fit now"),
    ],
)
def test_the_count_never_claims_more_than_it_placed(fit, label):
    assert fit.label == label


def test_targets_are_said_as_host_gpu_and_slice(small_fleet):
    mig, mps, whole = small_fleet["mig"], small_fleet["mps"], small_fleet["whole"]
    gpus = {g.pk: g for g in (mig, mps, whole)}
    one_g = Partition.objects.get(gpu=mig, start=0)
    share = Partition.objects.get(gpu=mps)
    partitions = {p.pk: p for p in (one_g, share)}

    def words(target: Target, kind: str) -> str:
        return target_words(target, kind, gpus, partitions)

    assert words(Target(mig.pk, one_g.pk, None, 0, (mig.pk,)), "mig") == (
        "h100-x01/gpu0 · 1g.10gb@0 (free slice)"
    )
    assert words(Target(mig.pk, None, Instance(19, 6), 0, (mig.pk,)), "mig") == (
        "h100-x01/gpu0 · new 1g.10gb@6"
    )
    assert words(Target(mps.pk, share.pk, None, 0, (mps.pk,)), "mps") == (
        "h100-x01/gpu1 · MPS share"
    )
    assert words(Target(whole.pk, None, None, 0, (whole.pk,)), "gpu") == (
        "h100-x01/gpu2 (whole GPU)"
    )
    assert words(Target(mig.pk, None, None, 0, (mig.pk, whole.pk)), "gpu") == (
        "h100-x01/gpu0+gpu2 (whole GPUs)"
    )


def test_a_deployment_that_fits_nowhere_carries_the_engines_main_reason():
    violation = Violation("placement.no_free_space", "GPU 3 has no free slices.")
    fit = FitNow(unplaced=2, fits=0, capped=False, best=None, reasons=((violation, 5),))

    shown = tray_fit(fit, "mig", {}, {})

    assert (shown.fits, shown.reason_code, shown.reason, shown.refusals) == (
        0,
        "placement.no_free_space",
        "GPU 3 has no free slices.",
        5,
    )


def test_the_tray_files_what_fits_now_apart_from_what_waits(operator_web, small_fleet):
    create("chat-small", 3, profile="1g.10gb")  # two free 1g.10gb slices on the MIG GPU

    html = operator_web.get("/ui/tray").content.decode()

    groups = sections(html)
    # Nothing is fully placed: no "Placed" heading with nothing under it.
    assert list(groups) == ["Unplaced, fits now", "Waiting, no capacity"]
    assert 'data-status="unplaced"' in groups["Unplaced, fits now"]
    assert 'data-status="waiting"' in groups["Waiting, no capacity"]
    chat = card(groups["Unplaced, fits now"], "chat-small")
    assert "2 of 3 fit now" in chat
    assert "best: h100-x01/gpu0 · 1g.10gb@0 (free slice)" in chat
    assert 'data-action="place-all"' in chat
    assert 'aria-label="Place all replicas of chat-small that fit now (2)"' in chat
    waiting = card(groups["Waiting, no capacity"], "llama-chat")  # 1/2: no 3g.40gb left
    assert 'title="placement.no_free_space' in waiting
    assert "place-all" not in waiting


def test_viewers_see_what_fits_without_the_place_all_button(viewer_web, small_fleet):
    create("chat-small", 1, profile="1g.10gb")

    html = viewer_web.get("/ui/tray").content.decode()

    chat = card(sections(html)["Unplaced, fits now"], "chat-small")
    assert "fits now" in chat and "place-all" not in chat


def test_a_container_deployment_waits_with_the_runtime_reason(operator_web, small_fleet):
    deployment_create(
        name="llm",
        request=DeploymentRequest(kind="mig", profile="1g.10gb"),
        replicas=1,
        workload={"runtime": "container", "image": "registry.example/llm:1"},
    )

    html = operator_web.get("/ui/tray").content.decode()

    llm = card(sections(html)["Waiting, no capacity"], "llm")
    assert "h100-x01 runs workloads with the none runtime; this deployment needs container." in llm


def test_the_demo_llama_with_free_1g_slices_fits_now(operator_web):
    seed_demo_fleet()

    html = operator_web.get("/").content.decode()

    llama = card(sections(html)["Unplaced, fits now"], "llama-3-8b-chat")
    assert "3/6 placed" in llama and "all 3 fit now" in llama


def test_on_the_demo_fleet_place_all_places_exactly_what_the_tray_counted():
    seed_demo_fleet()
    deployments = list(Deployment.objects.order_by("name"))
    unplaced = {
        d.pk: d.replicas - d.allocations.placed().values("replica").distinct().count()
        for d in deployments
    }
    fits = deployments_fit_now([(d, unplaced[d.pk]) for d in deployments])

    for deployment in deployments:
        if not unplaced[deployment.pk]:
            continue
        counted = fits[deployment.pk]
        with transaction.atomic():
            placed = _placed_by_place_all(deployment.pk)
            transaction.set_rollback(True)
        assert not counted.capped
        assert (deployment.name, counted.fits) == (deployment.name, placed)


def _placed_by_place_all(deployment_id: int) -> int:
    try:
        return len(deployment_place_all(deployment_id=deployment_id).operations)
    except ServiceError as error:
        if error.code != "place_all.nothing_fits":
            raise
        return 0


def test_the_tray_of_1000_gpus_costs_a_fixed_number_of_queries_and_stays_fast(
    operator_web, django_assert_max_num_queries
):
    seed_fleet(hosts=125)
    Host.objects.filter(name__endswith="7").update(runtime="docker")
    for name, kind, request in [
        ("chat", "mig", {"profile": "1g.10gb"}),
        ("rag", "mig", {"profile": "3g.40gb"}),
        ("asr", "mps", {"memory_mib": 12_288}),
        ("train", "gpu", {"gpu_count": 2}),
        ("huge", "mig", {"profile": "7g.80gb"}),
    ]:
        create(name, 200, kind=kind, **request)
    deployment_create(
        name="llm",
        request=DeploymentRequest(kind="mps", memory_mib=4096),
        replicas=40,
        workload={"runtime": "container", "image": "registry.example/llm:1"},
    )
    operator_web.get("/ui/tray")  # warm the engine's compiled scorer, as a running server has

    started = time.perf_counter()
    with django_assert_max_num_queries(16):
        html = operator_web.get("/ui/tray").content.decode()
    elapsed = time.perf_counter() - started

    groups = sections(html)
    for name in ("chat", "rag", "asr", "train", "llm"):
        assert "32+ of" in card(groups["Unplaced, fits now"], name), name
    assert "no_free_space" in card(groups["Waiting, no capacity"], "huge")  # no idle MIG GPU
    print(f"tray of 1,000 GPUs, 6 deployments: {elapsed * 1000:.0f} ms")
    assert elapsed < 5, elapsed


def test_a_replica_placed_changes_the_cards_signature_so_the_tray_redraws(
    operator_web, small_fleet
):
    deployment = create("chat-small", 3, profile="1g.10gb")

    def signature() -> str:
        html = operator_web.get("/ui/tray").content.decode()
        found = re.search(r'data-sig="(\w+)"', card(html, "chat-small"))
        assert found
        return found.group(1)

    before = signature()
    one_g = Partition.objects.get(gpu=small_fleet["mig"], start=0)
    deployment_place(deployment_id=deployment.pk, partition_id=one_g.pk)

    assert signature() != before
