"""The deployment pages: the list and one deployment, for viewers and operators; honest values
("—" where nothing was reported); the fragments the live script re-fetches."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.allocations.models import Allocation, AllocationState, WorkloadState
from fleet.allocations.scaling import deployment_scale
from fleet.allocations.services import (
    DeploymentRequest,
    deployment_create,
    deployment_delete,
    deployment_evict,
    deployment_place,
)
from fleet.allocations.states import DeploymentStatus
from fleet.inventory.models import HealthEvent, HealthEventKind
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.web.presenters import TrayFit
from fleet.web.presenters_deployments import (
    deployment_state,
    format_duration,
    workload_summary,
)
from tests.factories import GpuFactory, HostFactory, allow_process

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _processes_allowed(db):
    """Replicas here run processes: the default team's policy allows them."""
    allow_process()


PROCESS = {
    "runtime": "process",
    "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
    "stop_grace_s": 5,
}


@pytest.fixture
def worker(small_fleet):
    """feature-worker: two MPS replicas running as processes, one restarted twice, and a third
    replica stopping (evicted, its process still exiting)."""
    host = HostFactory(name="a30-d01", runtime="process", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="a30-24gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="feature-worker",
        request=DeploymentRequest(kind="mps", memory_mib=2048, max_compute_percent=10),
        replicas=3,
        workload=PROCESS,
    )
    for _ in range(3):
        deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    started = timezone.now() - timedelta(minutes=5)
    Allocation.objects.filter(deployment=deployment).update(
        state=AllocationState.ACTIVE, workload_state=WorkloadState.RUNNING, started_at=started
    )
    Allocation.objects.filter(deployment=deployment, replica=1).update(restarts=2)
    deployment_scale(deployment_id=deployment.pk, replicas=2)  # replica 2 goes releasing
    return {"deployment": deployment, "gpu": gpu, "host": host}


def pages(fleet):
    return ["/deployments/", f"/deployments/{fleet['deployment'].pk}/"]


def test_anonymous_users_are_sent_to_the_login_page(client, small_fleet):
    deployment = small_fleet["deployment"].pk
    for url in [
        *pages(small_fleet),
        "/ui/deployments",
        f"/ui/deployments/{deployment}/panel",
    ]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_users_without_a_role_get_the_no_access_page(nobody_web, small_fleet):
    for url in pages(small_fleet):
        assert nobody_web.get(url).status_code == 403, url


@pytest.mark.parametrize("persona", ["viewer_web", "operator_web"])
def test_both_pages_render_for_each_role_with_one_h1_and_the_nav_link(
    request, persona, small_fleet
):
    client = request.getfixturevalue(persona)
    for url in pages(small_fleet):
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert html.count("<h1") == 1, url
        assert '<a href="/deployments/" aria-current="page">Deployments</a>' in html, url


def test_an_unknown_deployment_is_a_404(viewer_web):
    assert viewer_web.get("/deployments/999999/").status_code == 404
    assert viewer_web.get("/ui/deployments/999999/panel").status_code == 404


def text(html: str) -> str:
    """What a reader sees: the markup without its tags, spaces collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def row_of(html: str, name: str) -> str:
    found = re.search(
        rf'<tr class="dep-row"[^>]*>\s*<th scope="row"><a [^>]*>{name}</a>.*?</tr>', html, re.S
    )
    assert found, name
    return found.group(0)


def test_the_list_shows_request_workload_replicas_restarts_and_state(viewer_web, worker):
    html = viewer_web.get("/deployments/").content.decode()

    chat = row_of(html, "llama-chat")  # MIG, runtime none, 1 of 2 placed
    assert "MIG 3g.40gb" in chat and ">none<" in chat
    assert "— / 1 / 2" in text(chat)  # nothing runs: no running count is made up
    # Its one GPU has no 3g.40gb left: it waits, and says why, naming the GPU.
    assert 'data-status="waiting"' in chat and "waiting, no capacity" in chat
    assert re.search(r"No 3g\.40gb slice is free on [\w-]+/gpu\d+\.", chat), text(chat)
    assert not re.search(r"\bGPU \d+", chat)

    workers = row_of(html, "feature-worker")
    assert "MPS 2 GiB · 10% SM" in workers
    assert "/bin/sh -c" in workers and ">process<" in workers
    assert "2 / 2 / 2" in workers and "(1 stopping)" in workers
    assert '<td class="mono">2</td>' in workers  # restarts of the placed replicas
    assert 'data-status="running"' in workers and ">running<" in workers
    for header in ["Name", "Request", "Workload", "Replicas", "Restarts", "State"]:
        assert f'<th scope="col">{header}' in html


def test_the_list_costs_a_fixed_number_of_queries(
    viewer_web, worker, django_assert_max_num_queries
):
    for i in range(15):
        deployment_create(
            name=f"extra-{i}", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=2
        )
    # What fits now of every row's unplaced replicas: one fleet snapshot for all of them.
    with django_assert_max_num_queries(14):
        assert viewer_web.get("/ui/deployments").status_code == 200


def test_the_detail_shows_each_replica_with_its_slice_and_workload(viewer_web, worker):
    deployment, gpu = worker["deployment"], worker["gpu"]
    Allocation.objects.filter(deployment=deployment, replica=1).update(
        workload_state=WorkloadState.FAILED, exit_code=137, workload_message="killed: out of memory"
    )
    html = viewer_web.get(f"/deployments/{deployment.pk}/").content.decode()

    assert '<h1><span class="mono">feature-worker</span></h1>' in html
    assert f'href="/gpus/{gpu.pk}/"' in html and "a30-d01/gpu" in html
    assert "MPS share · 2 GiB · 10% SM" in html
    replica_0 = re.search(r'<tr data-replica="0".*?</tr>', html, re.S).group(0)
    assert ">Running<" in replica_0 and ">5 min<" in replica_0  # uptime from started_at
    assert replica_0.count(">—<") == 2  # no exit code, no message: not made up
    replica_1 = re.search(r'<tr data-replica="1".*?</tr>', html, re.S).group(0)
    assert ">Failed<" in replica_1 and ">137<" in replica_1 and "killed: out of memory" in replica_1
    releasing = re.search(
        r'<tr data-replica="2" data-allocation-state="releasing".*?</tr>', html, re.S
    )
    assert releasing and ">releasing<" in releasing.group(0)
    assert "<dd data-wanted>2</dd>" in html and "<dd data-stopping>1</dd>" in html


def test_the_detail_lists_unplaced_replicas_and_says_nothing_runs_for_runtime_none(
    viewer_web, small_fleet
):
    html = viewer_web.get(f"/deployments/{small_fleet['deployment'].pk}/").content.decode()
    unplaced = re.search(
        r'<tr data-replica="1" data-allocation-state="unplaced".*?</tr>', html, re.S
    )
    assert unplaced and "not placed" in unplaced.group(0)
    assert "nothing runs" in html
    assert (
        "3g.40gb" in html and "&quot;runtime&quot;: &quot;none&quot;" in html
    )  # the spec as given


def test_the_detail_shows_its_operations_and_the_events_of_its_gpus(viewer_web, worker):
    deployment, gpu = worker["deployment"], worker["gpu"]
    HealthEvent.objects.create(
        host=worker["host"], gpu=gpu, kind=HealthEventKind.XID, xid=79, ts=timezone.now()
    )
    other = HostFactory(name="elsewhere")
    HealthEvent.objects.create(
        host=other,
        kind=HealthEventKind.CRASHLOOP,
        detail="feature-worker replica 0 (allocation 9): 5 failures within 60 s; last: exit 1",
        ts=timezone.now(),
    )
    HealthEvent.objects.create(
        host=other, kind=HealthEventKind.HOST_OFFLINE, detail="not ours", ts=timezone.now()
    )
    html = viewer_web.get(f"/deployments/{deployment.pk}/").content.decode()

    assert "Scaled feature-worker from 3 to 2 replicas" in html
    assert "Created deployment feature-worker" in html
    assert "Xid 79" in html and "5 failures within 60 s" in html
    assert "not ours" not in html


def test_operators_get_a_labelled_replicas_editor_and_viewers_do_not(
    operator_web, viewer_web, small_fleet
):
    url = f"/deployments/{small_fleet['deployment'].pk}/"
    html = operator_web.get(url).content.decode()
    assert '<label for="replicas-input">Replicas wanted</label>' in html
    assert 'id="replicas-input" name="replicas" type="number"' in html and 'value="2"' in html
    assert 'id="scale-error" class="form-error" role="alert" hidden' in html
    viewer = viewer_web.get(url).content.decode()
    assert 'id="scale-form"' not in viewer and "Operators can change the replica count" in viewer


def test_any_role_gets_a_labelled_logs_panel_listing_the_placed_replicas(viewer_web, worker):
    deployment = worker["deployment"]
    html = viewer_web.get(f"/deployments/{deployment.pk}/").content.decode()
    panel = re.search(r'<details id="dep-logs".*?</details>', html, re.S).group(0)
    assert '<label for="logs-replica">Replica</label>' in panel
    assert '<button type="button" class="btn small" id="logs-refresh">Refresh</button>' in panel
    # Follow and Wrap are on by default; search and download are labelled controls.
    assert re.search(
        r'<label[^>]*for="logs-follow"><input type="checkbox" id="logs-follow" checked>', panel
    )
    assert re.search(r'<input type="checkbox" id="logs-wrap" checked>', panel)
    assert '<label for="logs-search">Search</label>' in panel
    assert 'id="logs-download">Download .txt</button>' in panel
    assert re.search(r'<pre id="logs-output"[^>]*aria-live="polite"', panel)
    options = re.findall(r'<option value="(\d+)">([^<]*)</option>', panel)
    allocations = Allocation.objects.filter(deployment=deployment).order_by("replica")
    assert [int(value) for value, _ in options] == [a.pk for a in allocations]
    assert options[0][1].startswith("Replica 0 on a30-d01/gpu") and "(Running)" in options[0][1]
    assert "(releasing)" in options[2][1]
    # The table carries the same for the script, which rebuilds the picker after a change.
    assert html.count("data-allocation-id=") == 3


def test_a_deployment_that_runs_nothing_has_no_logs_panel(viewer_web, small_fleet):
    html = viewer_web.get(f"/deployments/{small_fleet['deployment'].pk}/").content.decode()
    assert 'id="dep-logs"' not in html


def test_a_deleting_deployment_shows_it_and_disables_the_editor(operator_web, worker):
    deployment = worker["deployment"]
    deployment_delete(deployment_id=deployment.pk)
    html = operator_web.get(f"/deployments/{deployment.pk}/").content.decode()
    assert 'data-state="deleting"' in html
    assert re.search(r'id="replicas-input"[^>]* disabled', html)


def test_the_panel_fragment_re_renders_the_live_parts_after_a_scale(viewer_web, small_fleet):
    deployment = small_fleet["deployment"]
    deployment_scale(deployment_id=deployment.pk, replicas=3)

    html = viewer_web.get(f"/ui/deployments/{deployment.pk}/panel").content.decode()

    for part in ["dep-head", "dep-replicas", "dep-side"]:
        assert f'id="{part}"' in html
    assert "<dd data-wanted>3</dd>" in html
    assert "Scaled llama-chat from 2 to 3 replicas" in html
    assert f'data-gpus="{small_fleet["mig"].pk}"' in html  # what the script listens for


def test_the_rows_fragment_follows_evictions(viewer_web, small_fleet):
    deployment_evict(deployment_id=small_fleet["deployment"].pk)
    html = viewer_web.get("/ui/deployments").content.decode()
    assert "— / 0 / 2" in text(row_of(html, "llama-chat"))


@pytest.mark.parametrize(
    ("facts", "status", "note"),
    [
        ({"deleting": True, "failing": 1}, "running", "deleting"),
        ({"failing": 1}, "running", "degraded"),
        ({"placed": 1, "running": 1}, "waiting", ""),
        ({"placed": 1, "running": 1, "fit": TrayFit(1, 1)}, "unplaced", ""),
        ({"applying": 1, "running": 1}, "placed", "applying"),
        ({"runtime": "none", "running": 0}, "placed", ""),
        ({}, "running", ""),
        ({"running": 1}, "placed", "starting"),
    ],
)
def test_the_state_of_a_deployment_in_words(facts, status, note):
    base = {
        "deleting": False,
        "runtime": "process",
        "wanted": 2,
        "placed": 2,
        "running": 2,
        "applying": 0,
        "failing": 0,
    }
    state = deployment_state(**{**base, **facts})
    assert (state.status, state.note) == (status, note)
    assert state.label == DeploymentStatus(status).label


def test_a_waiting_deployment_says_why_and_one_that_fits_says_how_many():
    base = {"deleting": False, "runtime": "process", "wanted": 3, "placed": 1, "running": 1}
    base |= {"applying": 0, "failing": 0}
    waiting = deployment_state(**base, fit=TrayFit(2, 0, reason="No GPU has room."))
    assert (waiting.label, waiting.reason, waiting.fits) == (
        "waiting, no capacity",
        "No GPU has room.",
        "",
    )
    fits = deployment_state(**base, fit=TrayFit(2, 2))
    assert (fits.label, fits.fits, fits.reason) == ("unplaced, fits now", "all 2 fit now", "")


@pytest.mark.parametrize(
    ("workload", "shown"),
    [
        ({"runtime": "none"}, "none"),
        (None, "none"),
        (
            {"runtime": "container", "image": "reg/llm:1", "command": ["serve", "--x y"]},
            'reg/llm:1 serve "--x y"',
        ),
        ({"runtime": "process", "command": ["python", "-m", "worker"]}, "python -m worker"),
        (
            {"runtime": "process", "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 1"]},
            "/bin/sh -c \"trap 'exit 0' TERM; sleep 1\"",
        ),
        ({"runtime": "container", "image": "reg/llm:1", "command": []}, "reg/llm:1"),
    ],
)
def test_a_workload_is_shown_by_its_image_or_command(workload, shown):
    assert workload_summary(workload) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3720, "1 h 2 min"),
        (2 * 86400 + 5 * 3600, "2 d 5 h"),
    ],
)
def test_an_uptime_reads_in_the_largest_useful_units(seconds, shown):
    assert format_duration(seconds) == shown
