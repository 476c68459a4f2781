"""The fleet's capacity report, and request answers checked against the engine placing replicas."""

from __future__ import annotations

import random

import pytest

from fleet.mig import product_by_key, valid_layouts
from fleet.mps import MpsPolicy, MpsRequest
from fleet.placement.capacity import capacity, request_fit
from fleet.placement.fit import rank
from fleet.placement.mix import RequestMix, RequestShape
from fleet.placement.simulate import apply_target
from fleet.placement.snapshot import (
    FleetSnapshot,
    GpuState,
    HostState,
    MigPartition,
    MigRequest,
    PlacementRequest,
    WholeGpuRequest,
)

H100 = "h100-sxm5-80gb"
MEM = 81559
PRODUCT = product_by_key(H100)
assert PRODUCT is not None


def pid(name: str) -> int:
    profile = PRODUCT.profile(name)
    assert profile is not None
    return profile.id


def small_fleet() -> FleetSnapshot:
    mig = GpuState(
        1,
        1,
        H100,
        MEM,
        "mig",
        partitions=(
            MigPartition(10, pid("3g.40gb"), 0, occupied=True),
            MigPartition(11, pid("1g.10gb"), 4),
        ),
    )
    mps = GpuState(
        2, 1, H100, MEM, "mps", mps_reservations=(MpsRequest(20000), MpsRequest(20000, 50))
    )
    return FleetSnapshot(
        (HostState(1), HostState(2, cordoned=True)),
        (
            mig,
            mps,
            GpuState(3, 1, H100, MEM),
            GpuState(4, 1, H100, MEM, taken=True),
            GpuState(5, 2, H100, MEM),
            GpuState(6, 1, H100, MEM, healthy=False),
        ),
    )


def shapes(*weighted: tuple[RequestShape, float]) -> RequestMix:
    return RequestMix.from_counts(dict(weighted), coverage=1.0)


def test_the_report_counts_schedulable_gpus_and_each_profile_now_and_after_a_reshape() -> None:
    (h100,) = capacity(small_fleet(), None).products

    fits = {p.profile: (p.fits_now, p.fits_if_idle_reshaped) for p in h100.profiles}
    assert (h100.gpus, h100.schedulable_gpus, h100.mig_gpus) == (6, 4, 1)
    assert fits["1g.10gb"] == (3, 3)  # the idle one at 4, new ones at 5 and 6
    assert fits["3g.40gb"] == (0, 1)  # slices 4-7 once the idle 1g.10gb goes
    assert fits["1g.10gb+me"] == (1, 1)
    assert h100.whole_free_gpus == 1


def test_mps_memory_is_stranded_only_where_no_share_of_the_mix_fits() -> None:
    small = capacity(small_fleet(), shapes((RequestShape("mps", memory_mib=20000), 1.0)))
    large = capacity(small_fleet(), shapes((RequestShape("mps", memory_mib=50000), 1.0)))

    assert small.products[0].mps.free_memory_mib == MEM - 40000
    assert small.products[0].mps.free_clients == 46
    assert small.products[0].mps.stranded_memory_mib == 0
    assert large.products[0].mps.stranded_memory_mib == MEM - 40000


def test_a_compute_cap_above_the_daemon_policy_strands_its_memory() -> None:
    gpu = GpuState(
        1,
        1,
        H100,
        MEM,
        "mps",
        mps_reservations=(MpsRequest(1000),),
        mps_policy=MpsPolicy(default_active_thread_percentage=25),
    )
    fleet = FleetSnapshot((HostState(1),), (gpu,))
    wants_half = shapes((RequestShape("mps", memory_mib=1000, compute_percent=50), 1.0))

    assert capacity(fleet, wants_half).products[0].mps.stranded_memory_mib == MEM - 1000


def test_an_mps_gpu_without_clients_strands_nothing() -> None:
    fleet = FleetSnapshot((HostState(1),), (GpuState(1, 1, H100, MEM, "mps"),))
    report = capacity(fleet, shapes((RequestShape("mps", memory_mib=MEM + 1), 1.0)))
    assert report.products[0].mps.stranded_memory_mib == 0


def test_fragmentation_is_summed_over_schedulable_hosts_and_said_in_gpus() -> None:
    report = capacity(small_fleet(), shapes((RequestShape("gpu", gpu_count=1), 1.0)))

    assert [h.host_id for h in report.hosts] == [1]
    # Against whole-GPU requests, the MIG GPU's free slices and the MPS GPU's free memory are
    # stranded; the idle dedicated GPU is not.
    assert report.free_milli == pytest.approx(1000 + 1000 * 4 / 8 + 1000 * (MEM - 40000) / MEM)
    assert report.stranded_gpu_equivalents == pytest.approx(report.fragmented_milli / 1000)
    assert report.fragmented_milli == pytest.approx(report.free_milli - 1000)
    assert 0 < report.score < 1


def test_an_empty_fleet_reports_nothing_free_and_no_fragmentation() -> None:
    report = capacity(FleetSnapshot((), ()), None)
    assert (report.products, report.score, report.stranded_gpu_equivalents) == ((), 0.0, 0.0)


def test_a_request_answer_counts_replicas_per_product() -> None:
    fleet = small_fleet()

    mig = request_fit(fleet, MigRequest("1g.10gb"))
    mps = request_fit(fleet, MpsRequest(20000, 50))
    whole = request_fit(fleet, WholeGpuRequest(1))

    assert (mig.fits_now, mig.fits_if_idle_reshaped, mig.products) == (3, 3, ((H100, 3, 3),))
    assert (mps.fits_now, mps.fits_if_idle_reshaped) == (2, None)
    assert (whole.fits_now, request_fit(fleet, WholeGpuRequest(2)).fits_now) == (1, 0)


def placed_by_engine(fleet: FleetSnapshot, request: PlacementRequest, limit: int) -> int:
    """Replicas the engine places one after another (the product strategy) until none fits."""
    count = 0
    while count < limit:
        best = rank(fleet, request).best
        if best is None:
            return count
        fleet = apply_target(fleet, request, best)
        count += 1
    return count


def random_fleet(rnd: random.Random) -> FleetSnapshot:
    layouts = valid_layouts(PRODUCT)
    hosts = tuple(HostState(h, cordoned=rnd.random() < 0.15) for h in range(1, 4))
    gpus: list[GpuState] = []
    next_partition = 100
    for gpu_id in range(1, 10):
        host_id = rnd.randint(1, 3)
        mode = rnd.choice(["mig", "mig", "mps", "dedicated"])
        if mode == "mig":
            partitions = []
            for instance in rnd.choice(layouts):
                next_partition += 1
                partitions.append(
                    MigPartition(
                        next_partition, instance.profile_id, instance.start, rnd.random() < 0.5
                    )
                )
            gpus.append(GpuState(gpu_id, host_id, H100, MEM, "mig", partitions=tuple(partitions)))
        elif mode == "mps":
            reserved = tuple(MpsRequest(rnd.choice([4000, 10000, 30000])) for _ in range(3))
            gpus.append(GpuState(gpu_id, host_id, H100, MEM, "mps", mps_reservations=reserved))
        else:
            gpus.append(GpuState(gpu_id, host_id, H100, MEM, taken=rnd.random() < 0.4))
    return FleetSnapshot(hosts, tuple(gpus))


REQUESTS: list[PlacementRequest] = [
    *(MigRequest(p.name) for p in PRODUCT.profiles),
    MpsRequest(10000),
    MpsRequest(30000, 50),
    WholeGpuRequest(1),
    WholeGpuRequest(2),
]


@pytest.mark.parametrize("seed", range(6))
def test_the_engine_places_exactly_as_many_replicas_as_the_answer_says(seed: int) -> None:
    fleet = random_fleet(random.Random(seed))
    for request in REQUESTS:
        expected = request_fit(fleet, request).fits_now
        assert placed_by_engine(fleet, request, expected + 3) == expected, request


def test_the_same_layout_on_many_gpus_is_counted_once_per_gpu() -> None:
    busy = MigPartition(1, pid("4g.40gb"), 0, occupied=True)
    gpus = tuple(GpuState(i, 1, H100, MEM, "mig", partitions=(busy,)) for i in range(1, 51))
    fleet = FleetSnapshot((HostState(1),), gpus)
    assert request_fit(fleet, MigRequest("3g.40gb")).fits_now == 50
    assert request_fit(fleet, MigRequest(pid("1g.10gb"))).fits_now == 150
