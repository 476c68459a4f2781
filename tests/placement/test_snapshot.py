from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.placement.snapshot import FleetSnapshot, GpuState, HostState

H100 = "h100-sxm5-80gb"


def snapshot() -> FleetSnapshot:
    hosts = (HostState(1), HostState(2), HostState(3))
    gpus = (
        GpuState(10, 2, H100, 80000),
        GpuState(11, 1, H100, 80000),
        GpuState(12, 2, H100, 80000),
    )
    return FleetSnapshot(hosts, gpus)


def test_hosts_and_gpus_are_found_by_id() -> None:
    fleet = snapshot()

    assert fleet.host(2) == HostState(2)
    assert fleet.host(9) is None
    assert fleet.gpu(12) == fleet.gpus[2]
    assert fleet.gpu(99) is None


def test_gpus_are_grouped_by_host_in_the_order_of_their_first_gpu() -> None:
    groups = snapshot().host_groups

    assert [(g.host_id, [gpu.id for gpu in g.gpus], g.positions) for g in groups] == [
        (2, [10, 12], (0, 2)),
        (1, [11], (1,)),
    ]


def test_changes_replace_states_in_place_and_keep_the_untouched_groups() -> None:
    fleet = snapshot()
    groups = fleet.host_groups
    groups[1].memo["kept"] = True

    changed = fleet.with_changes(
        hosts=(HostState(2, cordoned=True),), gpus=(replace(fleet.gpus[0], taken=True),)
    )

    assert changed.gpus[0].taken and changed.host(2) == HostState(2, cordoned=True)
    assert changed.host_groups[1] is groups[1] and changed.host_groups[1].memo == {"kept": True}
    assert changed.host_groups[0] is not groups[0]
    assert changed.host_groups[0].host == HostState(2, cordoned=True)
    assert changed == FleetSnapshot(changed.hosts, changed.gpus)


def test_a_change_must_name_a_known_gpu_on_its_own_host() -> None:
    fleet = snapshot()

    with pytest.raises(KeyError):
        fleet.with_changes(gpus=(GpuState(99, 1, H100, 80000),))
    with pytest.raises(KeyError):
        fleet.with_changes(gpus=(replace(fleet.gpus[0], host_id=1),))


def test_a_gpu_state_memo_dies_with_the_state() -> None:
    gpu = GpuState(1, 1, H100, 80000)
    gpu.memo["x"] = 1

    assert replace(gpu).memo == {}
    assert gpu == replace(gpu)
