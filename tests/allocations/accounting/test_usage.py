"""Usage history: every allocation row opens an interval and its deletion, however it is
deleted, closes it; a team handoff splits it; the sums per group add up to their intervals (a
property test over random place, move, evict and handoff sequences at controlled times)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleet.allocations.accounting.usage import (
    Window,
    hours_within,
    rates,
    summarize,
    timeline,
    usage_report,
    usage_window,
)
from fleet.allocations.models import Allocation, AllocationState, Deployment, UsageInterval
from fleet.allocations.ownership import deployment_set_team
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_evict,
    deployment_place,
)
from fleet.core.errors import ServiceError
from fleet.core.teams import team_create
from fleet.inventory.models import Gpu
from fleet.mps import MpsPolicy
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.factories import GpuFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def clock(when: datetime):  # type: ignore[no-untyped-def]
    return mock.patch("fleet.allocations.accounting.usage.timezone.now", return_value=when)


def fleet_of_three():
    """An H100 in MIG (1g.10gb x2, 3g.40gb), one in MPS, one dedicated."""
    mig = GpuFactory(product_key="h100-sxm5-80gb")
    instances = (("1g.10gb", 0), ("1g.10gb", 1), ("3g.40gb", 4))
    spec = tuple(MigInstanceSpec(profile=p, start=s) for p, s in instances)
    gpu_set_layout(gpu_id=mig.pk, spec=LayoutSpec(mode="mig", instances=spec))
    mps = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=mps.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    whole = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=whole.pk, spec=LayoutSpec(mode="dedicated"))
    return mig, mps, whole


def place(deployment: Deployment, gpu: Gpu, when: datetime) -> None:
    with clock(when):
        deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)


def test_each_kind_opens_an_interval_with_its_request():
    mig_gpu, mps_gpu, whole_gpu = fleet_of_three()
    team = team_create(name="search")
    mig = deployment_create(
        name="m",
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        team_id=team.pk,
        replicas=1,
    )
    mps = deployment_create(
        name="s",
        request=DeploymentRequest(kind="mps", memory_mib=20480, max_compute_percent=30),
        replicas=1,
    )
    whole = deployment_create(
        name="w", request=DeploymentRequest(kind="gpu", gpu_count=1), replicas=1
    )
    for d, gpu in ((mig, mig_gpu), (mps, mps_gpu), (whole, whole_gpu)):
        place(d, gpu, at(0))
    rows = {i.deployment_name: i for i in UsageInterval.objects.all()}
    m, s, w = rows["m"], rows["s"], rows["w"]
    assert (m.kind, m.profile, m.compute_slices, m.gpu_compute_slices) == ("mig", "3g.40gb", 3, 7)
    assert (m.team_name, m.started_at, m.ended_at) == ("search", at(0), None)
    assert m.product_key == "h100-sxm5-80gb"
    assert (s.kind, s.memory_mib, s.compute_percent, s.team_name) == ("mps", 20480, 30, "default")
    assert (w.kind, w.gpu_count) == ("gpu", 1)


def test_every_deletion_closes_its_interval():
    _, mps_gpu, _ = fleet_of_three()
    ds = [
        deployment_create(
            name=f"d{i}", request=DeploymentRequest(kind="mps", memory_mib=1024), replicas=1
        )
        for i in range(3)
    ]
    for d in ds:
        place(d, mps_gpu, at(0))
    with clock(at(1)):
        Allocation.objects.get(deployment=ds[0]).delete()  # one row
    with clock(at(2)):
        Allocation.objects.filter(deployment=ds[1]).delete()  # a queryset: per-row signals
    with clock(at(3)):
        Deployment.objects.filter(pk=ds[2].pk).delete()  # a cascade
    ends = dict(UsageInterval.objects.values_list("deployment_name", "ended_at"))
    assert ends == {"d0": at(1), "d1": at(2), "d2": at(3)}


def interval(**fields):  # type: ignore[no-untyped-def]
    base = {
        "allocation_id": fields.pop("allocation_id", 1),
        "deployment_id": 1,
        "deployment_name": "d",
        "team_id": 1,
        "team_name": "t",
        "replica": 0,
        "gpu_id": 1,
        "gpu_memory_mib": 81920,
        "product_key": "h100-sxm5-80gb",
        "product_name": "NVIDIA H100 80GB HBM3",
        "started_at": at(0),
    }
    return UsageInterval(**{**base, **fields})


def test_rates_per_unit():
    mig = rates(interval(kind="mig", compute_slices=3, gpu_compute_slices=7, memory_mib=40960))
    assert mig["mig_slice_hours"] == 3 and mig["gpu_equivalent_hours"] == pytest.approx(3 / 7)
    capped = rates(interval(kind="mps", memory_mib=20480, compute_percent=50))
    assert capped["mps_gib_hours"] == 20 and capped["mps_compute_percent_hours"] == 50
    assert capped["gpu_equivalent_hours"] == 0.5  # max(0.25 memory, 0.5 compute)
    uncapped = rates(interval(kind="mps", memory_mib=20480, compute_percent=None))
    assert uncapped["mps_compute_percent_hours"] == 0
    assert uncapped["gpu_equivalent_hours"] == 0.25  # its memory share only
    whole = rates(interval(kind="gpu", gpu_count=1, memory_mib=81920))
    assert whole["gpu_hours"] == 1 and whole["gpu_equivalent_hours"] == 1


def test_clipping():
    closed = interval(kind="gpu", gpu_count=1, started_at=at(1), ended_at=at(5))
    assert hours_within(closed, at(0), at(10), at(10)) == 4
    assert hours_within(closed, at(2), at(3), at(10)) == 1
    assert hours_within(closed, at(5), at(9), at(10)) == 0
    opened = interval(kind="gpu", gpu_count=1, started_at=at(1))
    assert hours_within(opened, at(0), at(10), now=at(4)) == 3  # runs until now
    assert hours_within(opened, at(0), at(2), now=at(4)) == 1  # or the window's end


def test_window_checks():
    with pytest.raises(ServiceError) as bad:
        usage_window(at(2), at(1), "team")
    assert bad.value.code == "usage.bad_window"
    with pytest.raises(ServiceError) as long:
        usage_window(at(0), at(24 * 401), "team")
    assert long.value.code == "usage.window_too_long"
    with pytest.raises(ServiceError):
        usage_window(None, None, "host")
    window = usage_window(None, None, None, now=at(48))
    assert (window.start, window.end, window.group_by) == (at(24), at(48), "team")


def test_report_and_timeline_sum_per_team():
    interval(allocation_id=1, kind="gpu", gpu_count=1, started_at=at(0), ended_at=at(2)).save()
    interval(
        allocation_id=2, kind="mps", memory_mib=40960, team_id=2, team_name="u", started_at=at(1)
    ).save()
    window = Window(at(0), at(4), "team", now=at(3))
    report = usage_report(window)
    by = {g["name"]: g for g in report["groups"]}
    assert by["t"]["gpu_hours"] == 2 and by["u"]["mps_gib_hours"] == 80  # 40 GiB x 2 h
    assert report["totals"]["gpu_equivalent_hours"] == 3  # 2 + 0.5 x 2
    starts, series = timeline(window)
    assert len(starts) == 4
    assert series["t"] == [1, 1, 0, 0] and series["u"] == [0, 0.5, 0.5, 0]


# --- numbers must add up ----------------------------------------------------------------------

MIX = [
    DeploymentRequest(kind="mig", profile="1g.10gb"),
    DeploymentRequest(kind="mps", memory_mib=8192, max_compute_percent=25),
    DeploymentRequest(kind="mps", memory_mib=30000),
    DeploymentRequest(kind="gpu", gpu_count=1),
]
OPS = st.lists(
    st.tuples(
        st.sampled_from(["place", "move", "evict", "handoff"]),
        st.integers(0, 3),
        st.integers(1, 180),  # minutes after the previous operation
    ),
    min_size=3,
    max_size=16,
)


def independent_sum(start: datetime, end: datetime, now: datetime) -> dict[str, dict[str, float]]:
    """Each team's units from the raw rows, without the module's clipping or rates."""
    out: dict[str, dict[str, float]] = {}
    for i in UsageInterval.objects.all():
        stop = min(i.ended_at or now, end, now)
        hours = max(0.0, (stop - max(i.started_at, start)).total_seconds() / 3600)
        row = out.setdefault(i.team_name, dict.fromkeys(["slices", "gib", "pct", "gpu", "eq"], 0.0))
        if i.kind == "mig":
            row["slices"] += i.compute_slices * hours
            row["eq"] += i.compute_slices / i.gpu_compute_slices * hours
        elif i.kind == "mps":
            row["gib"] += i.memory_mib / 1024 * hours
            row["pct"] += (i.compute_percent or 0) * hours
            share = max(i.memory_mib / i.gpu_memory_mib, (i.compute_percent or 0) / 100)
            row["eq"] += share * hours
        else:
            row["gpu"] += hours
            row["eq"] += hours
    return {k: v for k, v in out.items() if any(v.values())}


RUNS = itertools.count()


def move(old: Allocation, copy_at: datetime, switch_at: datetime) -> None:
    """Make before break, as :mod:`fleet.allocations.moves` does: a new copy at ``copy_at``,
    then at ``switch_at`` the old one leaves the replica's place and is deleted, the new one
    promoted."""
    target = free_partition(old)
    if target is None:
        return
    with clock(copy_at):
        new = Allocation.objects.create(
            deployment=old.deployment,
            replica=old.replica,
            kind=old.kind,
            gpu_id=target.gpu_id,
            partition=target,
            memory_mib=old.memory_mib,
            compute_percent=old.compute_percent,
            replaces=old,
        )
    with clock(switch_at):
        Allocation.objects.filter(pk=old.pk).update(state=AllocationState.RELEASING)
        Allocation.objects.filter(pk=old.pk).delete()
        Allocation.objects.filter(pk=new.pk).update(replaces=None)


def free_partition(old: Allocation) -> Partition | None:
    """Where a move of ``old`` may go: its MPS GPU again, a free 1g.10gb, a free whole GPU."""
    if old.kind == "mps":
        return old.partition
    taken = Allocation.objects.values_list("partition_id", flat=True)
    kind = "mig" if old.kind == "mig" else "gpu"
    candidates = Partition.objects.filter(kind=kind).exclude(pk__in=taken)
    if kind == "gpu":
        candidates = candidates.filter(gpu__mode="dedicated")
    return candidates.order_by("pk").first()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS, window=st.tuples(st.integers(0, 600), st.integers(1, 900)))
def test_numbers_add_up(ops, window):
    Deployment.objects.all().delete()
    UsageInterval.objects.all().delete()
    run = next(RUNS)
    teams = [team_create(name=f"team{i}-{run}") for i in range(2)]
    deployments = [
        deployment_create(name=f"d{i}-{run}", request=request, team_id=teams[i % 2].pk, replicas=2)
        for i, request in enumerate(MIX)
    ]
    mig_gpu = GpuFactory(product_key="h100-sxm5-80gb")
    spec = tuple(MigInstanceSpec(profile="1g.10gb", start=s) for s in range(4))
    gpu_set_layout(gpu_id=mig_gpu.pk, spec=LayoutSpec(mode="mig", instances=spec))
    mps_gpu = GpuFactory(product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=mps_gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    wholes = [GpuFactory(product_key="h100-sxm5-80gb") for _ in range(3)]
    for whole in wholes:
        gpu_set_layout(gpu_id=whole.pk, spec=LayoutSpec(mode="dedicated"))
    targets = {"mig": [mig_gpu], "mps": [mps_gpu], "gpu": wholes}
    minutes = 0
    for op, which, gap in ops:
        minutes += gap
        now = T0 + timedelta(minutes=minutes)
        deployment = deployments[which]
        live = list(Allocation.objects.filter(deployment=deployment))
        with clock(now):
            if op == "place":
                for gpu in targets[deployment.kind]:
                    try:
                        deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
                        break
                    except ServiceError:
                        continue  # full or all placed: nothing placed, nothing opened
            elif op == "evict" and live:
                # Runtime none: the service deletes the rows at once (a queryset delete).
                deployment_evict(deployment_id=deployment.pk, replica=live[0].replica)
            elif op == "move" and live:
                move(live[0], now - timedelta(minutes=gap / 2), now)
            elif op == "handoff":  # to the other team: usage splits here
                other = teams[1] if deployment.team_id == teams[0].pk else teams[0]
                deployment_set_team(deployment_id=deployment.pk, team_id=other.pk)
                deployment.refresh_from_db()
    now = T0 + timedelta(minutes=minutes + 30)
    start = T0 + timedelta(minutes=window[0])
    end = start + timedelta(minutes=window[1])
    event(f"closed intervals: {min(UsageInterval.objects.exclude(ended_at=None).count(), 3)}")
    event(f"open intervals: {min(UsageInterval.objects.filter(ended_at=None).count(), 3)}")
    report = usage_report(Window(start, end, "team", now=now))
    got = {
        g["name"]: {
            "slices": g["mig_slice_hours"],
            "gib": g["mps_gib_hours"],
            "pct": g["mps_compute_percent_hours"],
            "gpu": g["gpu_hours"],
            "eq": g["gpu_equivalent_hours"],
        }
        for g in report["groups"]
    }
    expected = independent_sum(start, end, now)
    assert got.keys() == expected.keys()
    for team, units in expected.items():
        assert got[team] == pytest.approx(units, abs=1e-5)
    for unit in report["totals"]:
        assert report["totals"][unit] == pytest.approx(
            sum(g[unit] for g in report["groups"]), abs=1e-5
        )
    # Every allocation still there has exactly one open interval, every deleted one a closed one.
    open_ids = set(
        UsageInterval.objects.filter(ended_at=None).values_list("allocation_id", flat=True)
    )
    assert open_ids == set(Allocation.objects.values_list("pk", flat=True))
    assert UsageInterval.objects.filter(ended_at=None).count() == len(open_ids)
    # A handoff splits an interval without a gap or an overlap: each next one starts as the
    # one before it ends.
    by_allocation: dict[int, list[UsageInterval]] = {}
    for interval in UsageInterval.objects.order_by("started_at", "id"):
        by_allocation.setdefault(interval.allocation_id, []).append(interval)
    for chain in by_allocation.values():
        for before, after in itertools.pairwise(chain):
            assert before.ended_at == after.started_at and before.team_id != after.team_id
    assert summarize([], Window(start, end)) == []


def test_the_migration_opens_intervals_for_existing_allocations():
    from importlib import import_module

    from django.apps import apps

    _, mps_gpu, _ = fleet_of_three()
    d = deployment_create(
        name="old", request=DeploymentRequest(kind="mps", memory_mib=1024), replicas=1
    )
    place(d, mps_gpu, at(0))
    UsageInterval.objects.all().delete()  # as before the history existed
    migration = import_module("fleet.allocations.migrations.0010_usage_intervals")
    with clock(at(5)):
        migration.open_existing(apps, None)
    row = UsageInterval.objects.get()
    assert (row.deployment_name, row.started_at, row.ended_at, row.memory_mib) == (
        "old",
        at(5),
        None,
        1024,
    )
