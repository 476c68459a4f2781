"""The fragments the live scripts fetch: cards for changed rows, the tray, operation rows, the
GPU panel, the telemetry history."""

from __future__ import annotations

import time

import pytest

from fleet.allocations.models import Allocation
from fleet.core.models import Operation

pytestmark = pytest.mark.django_db


def test_cards_resolve_partitions_and_allocations_to_their_gpu(operator_web, small_fleet):
    allocation = Allocation.objects.get(deployment=small_fleet["deployment"])
    for query in (
        f"gpu={small_fleet['mig'].pk}",
        f"partition={small_fleet['three_g'].pk}",
        f"allocation={allocation.pk}",
    ):
        html = operator_web.get(f"/ui/cards?{query}").content.decode()
        assert f'id="gpu-{small_fleet["mig"].pk}"' in html, query
        assert f'id="gpu-{small_fleet["mps"].pk}"' not in html, query
        assert 'id="host-' in html


def test_all_cards_for_a_resync(operator_web, small_fleet):
    html = operator_web.get("/ui/cards?all=1").content.decode()
    assert html.count('<article class="gpu') == 3


def test_a_card_signature_changes_when_its_gpu_is_cordoned(operator_web, small_fleet):
    from fleet.partitioning.services import gpu_set_cordon

    def sig() -> str:
        html = operator_web.get(f"/ui/cards?gpu={small_fleet['mps'].pk}").content.decode()
        return html.split('data-sig="', 1)[1].split('"', 1)[0]

    before = sig()
    gpu_set_cordon(gpu_id=small_fleet["mps"].pk, cordoned=True, reason="maintenance")
    assert sig() != before


def test_the_tray_lists_pending_and_placed_deployments(operator_web, small_fleet):
    html = operator_web.get("/ui/tray").content.decode()
    assert "llama-chat" in html
    assert "1/2 placed" in html
    assert "applying" in html  # the placed replica waits for its agent


def test_operation_rows_by_id(operator_web, small_fleet):
    op = Operation.objects.order_by("-id").first()
    html = operator_web.get(f"/ui/operations?id={op.pk}").content.decode()
    assert f'id="op-{op.pk}"' in html
    assert html.count("<tr") == 1


def test_the_gpu_panel_rerenders_partitions_and_events(operator_web, small_fleet):
    html = operator_web.get(f"/ui/gpus/{small_fleet['mig'].pk}/panel").content.decode()
    assert 'id="gpu-panel"' in html and 'id="gpu-body"' in html
    assert "llama-chat[0]" in html


@pytest.fixture
def store():
    from fleet.inventory.telemetry import get_store

    store = get_store()
    store.clear()
    yield store
    store.clear()


def test_history_covers_the_last_hour_with_nulls_kept(operator_web, small_fleet, store):
    from fleet.inventory.telemetry import GpuTick

    gpu = small_fleet["mig"]
    now = time.time()
    for back in range(0, 3590, 10):
        tick = GpuTick(
            gpu_id=gpu.pk,
            utilization_percent=None,
            memory_used_mib=1000.0 + back,
            temperature_c=50.0,
            power_w=200.0,
            sample={},
        )
        store.record(host_id=gpu.host_id, ts=now - back, received_at=now, ticks=[tick])
    points = operator_web.get(f"/ui/gpus/{gpu.pk}/history").json()["points"]
    assert 300 <= len(points) <= 721
    assert all(p["utilization_percent"] is None for p in points)
    assert all(p["memory_used_mib"] is not None for p in points)
    assert points[0]["t"] >= now - 3600 - 5


def test_cards_show_the_latest_sample_from_the_telemetry_store(operator_web, small_fleet, store):
    from fleet.inventory.telemetry import GpuTick

    gpu = small_fleet["mps"]
    sample = {
        "utilization_gpu_percent": 87,
        "memory_used_mib": 2048,
        "memory_total_mib": 81559,
        "temperature_c": 66,
        "power_mw": 412000,
        "processes": [],
        "mig": [],
    }
    tick = GpuTick(
        gpu_id=gpu.pk,
        utilization_percent=87.0,
        memory_used_mib=2048.0,
        temperature_c=66.0,
        power_w=412.0,
        sample=sample,
    )
    store.record(host_id=gpu.host_id, ts=time.time(), received_at=time.time(), ticks=[tick])
    html = operator_web.get(f"/ui/cards?gpu={gpu.pk}").content.decode()
    assert 'data-heat="9"' in html and "87%" in html and "412 W" in html
