"""The deployment page's replica metrics panel: a labelled picker of replicas and windows, two
server-drawn SVG charts, "not available" with the hardware's reason where a series is null, and
the fragment its script re-fetches."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from fleet.inventory.telemetry import HostRecord, ReplicaTick
from tests.allocations.replica_fleet import ReplicaFleet, replica_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(mem_store: Any) -> ReplicaFleet:
    f = replica_fleet()
    now = time.time()
    for s in range(20):
        mem_store.record_many(
            [
                HostRecord(
                    f.host.pk,
                    now - 20 + s,
                    now,
                    [],
                    [ReplicaTick(f.mig.pk, None, 9000.0), ReplicaTick(f.mps_a.pk, None, 1500.0)],
                )
            ]
        )
    return f


def panel_of(html: str) -> str:
    match = re.search(r'<section class="panel rm-panel".*?</section>', html, re.S)
    assert match, "no replica metrics panel"
    return match.group(0)


def test_the_page_has_a_labelled_picker_and_two_charts_of_the_first_replica(viewer_web, fleet):
    html = viewer_web.get(f"/deployments/{fleet.mig.deployment_id}/").content.decode()
    panel = panel_of(html)
    assert 'aria-labelledby="rm-title"' in panel and 'id="rm-title"' in panel
    assert '<label for="rm-replica">Replica</label>' in panel
    assert f'<option value="{fleet.mig.pk}" selected>Replica 0 on ' in panel
    assert "<legend" in panel and panel.count('type="radio" name="window"') == 3
    assert 'value="1h" checked' in panel
    assert panel.count('<svg viewBox="-34 -6 640 144"') == 2
    assert panel.count('role="img"') == 2
    # MIG without GPM: the utilisation is not available, and says why; the memory is drawn.
    assert "NVML reports no utilisation for this MIG instance" in panel
    assert 'aria-label="Memory used of chat replica 0, last hour: latest 8.8 GiB"' in panel
    assert 'src="/static/web/replica_metrics.js"' in html


def test_the_fragment_draws_the_chosen_replica_and_window(viewer_web, fleet):
    url = f"/ui/deployments/{fleet.mps_a.deployment_id}/metrics"
    body = viewer_web.get(f"{url}?allocation={fleet.mps_a.pk}&window=24h").content.decode()
    assert "The memory of its processes (MPS share)" in body
    assert "last 24 hours" in body and "One point per 120 s" in body
    assert "NVML reports no utilisation per MPS client" in body
    assert body.count('<path class="line" d="M') == 1  # memory drawn, utilisation not
    other = viewer_web.get(f"{url}?allocation={fleet.mps_b.pk}&window=7d").content.decode()
    assert "No sample of this replica in this window" in other


def test_unknown_choices_fall_back_to_the_first_replica_and_the_hour(viewer_web, fleet):
    url = f"/ui/deployments/{fleet.mig.deployment_id}/metrics?allocation={fleet.mps_a.pk}&window=2y"
    body = viewer_web.get(url).content.decode()
    assert "From its MIG instance" in body and "last hour" in body


def test_a_deployment_without_placed_replicas_says_so(viewer_web, fleet):
    from fleet.allocations.services import DeploymentRequest, deployment_create

    idle = deployment_create(
        name="idle", request=DeploymentRequest(kind="mps", memory_mib=1000), replicas=1
    )
    panel = panel_of(viewer_web.get(f"/deployments/{idle.pk}/").content.decode())
    assert "No replica is placed yet" in panel and "rm-replica" not in panel


def test_the_fragment_needs_a_role_and_an_existing_deployment(
    client, nobody_web, viewer_web, fleet
):
    url = f"/ui/deployments/{fleet.mig.deployment_id}/metrics"
    assert client.get(url).status_code in (302, 401, 403)
    assert nobody_web.get(url).status_code == 403
    assert viewer_web.get("/ui/deployments/987654/metrics").status_code == 404
