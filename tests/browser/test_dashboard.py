"""The dashboard in a real browser against the running stack (ASGI server + simulated agents).

Run: ``.venv/bin/pytest tests/browser -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.browser.conftest import drag_over

pytestmark = pytest.mark.browser

SETTLED = """(pid) => {
  const s = document.querySelector(`.slice[data-partition="${pid}"]`);
  return !!s && s.classList.contains('used') && !s.classList.contains('alloc-pending');
}"""


def deployment_named(session: Any, name: str) -> dict[str, Any]:
    status, body = session.api("GET", "/api/v1/deployments/?limit=500")
    assert status == 200
    return next(d for d in body["results"] if d["name"] == name)


def allocations_of(session: Any, deployment_id: int) -> list[dict[str, Any]]:
    status, body = session.api("GET", f"/api/v1/allocations/?deployment={deployment_id}&limit=500")
    assert status == 200
    return list(body["results"])


def card(page: Any, label: str) -> Any:
    return page.locator(f'article.gpu[data-label="{label}"]')


def search(page: Any, text: str) -> None:
    page.fill("#search", text)
    page.wait_for_function(
        "(t) => [...document.querySelectorAll('article.gpu:not([hidden])')]"
        ".every(c => c.dataset.search.includes(t))",
        arg=text,
    )


def test_1_an_operator_drags_a_deployment_onto_a_mig_slice_and_sees_it_placed(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    deployment = deployment_named(session, "qwen-14b-batch")  # MIG 1g.6gb, replicas to place
    placed_before = deployment["placed_replicas"]
    search(page, "a30-d01")
    target = card(page, "a30-d01/gpu1").locator(".slice:not(.used)").first
    partition = int(target.get_attribute("data-partition"))
    page.screenshot(path=str(screenshots / "fleet-before-drop.png"))

    page.locator(f'.dep[data-deployment="{deployment["id"]}"]').drag_to(target)

    # The drop is accepted (a refusal would show an error toast), then the slice settles once
    # the agent has applied it. The "Placing…" toast is transient: not waited for under load.
    page.wait_for_function(SETTLED, arg=partition, timeout=30_000)
    assert page.locator(".toast.error").count() == 0
    mine = [a for a in allocations_of(session, deployment["id"]) if a["partition"] == partition]
    assert len(mine) == 1 and mine[0]["state"] == "active"  # the agent applied it
    tray = page.locator(f'.dep[data-deployment="{deployment["id"]}"]')
    tray.locator(".dep-meta", has_text=f"{placed_before + 1}/").wait_for(timeout=15_000)
    slice_title = page.locator(f'.slice[data-partition="{partition}"]').get_attribute("title")
    assert "qwen-14b-batch" in slice_title and "applying" not in slice_title
    assert session.errors == []


def test_2_a_drop_where_it_does_not_fit_shows_why_and_changes_nothing(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    deployment = deployment_named(session, "qwen-14b-batch")  # MIG: an MPS GPU cannot take it
    before = allocations_of(session, deployment["id"])
    search(page, "a30")
    target = card(page, "a30-d02/gpu0")
    signature = target.get_attribute("data-sig")
    source = page.locator(f'.dep[data-deployment="{deployment["id"]}"]')

    drag_over(page, source, target, fit="no")
    preview = target.locator(".fit-note").inner_text()
    assert "mps" in preview.lower(), preview  # the placement engine's reason, before the drop
    page.screenshot(path=str(screenshots / "fleet-drag-preview.png"))
    page.mouse.up()

    refusal = page.locator(".toast.error", has_text="does not fit")
    refusal.wait_for(timeout=15_000)
    assert re.search(r"mps mode|MIG", refusal.inner_text()), refusal.inner_text()
    time.sleep(1.0)  # any change would have reached the page by now
    assert allocations_of(session, deployment["id"]) == before
    assert target.get_attribute("data-sig") == signature
    assert session.errors == []


def _idle_mig_gpu(session: Any) -> dict[str, Any]:
    status, body = session.api("GET", "/api/v1/gpus/?mode=mig&product=H100&limit=500")
    assert status == 200
    for gpu in body["results"]:
        _, parts = session.api("GET", f"/api/v1/partitions/?gpu={gpu['id']}&limit=50")
        if all(p["allocated"] == 0 for p in parts["results"]) and not gpu["cordoned"]:
            return dict(gpu)
    raise AssertionError("no idle H100 in MIG mode in the demo fleet")


def _open_editor(session: Any, gpu: dict[str, Any]) -> Any:
    """The layout editor of ``gpu``, its live socket up."""
    page = session.page
    page.goto(f"{session.stack.url}/gpus/{gpu['id']}/layout/")
    session.wait_live()
    return page


def test_3_an_operator_edits_a_mig_layout_and_sees_the_gpu_redrawn(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    gpu = _idle_mig_gpu(session)
    page = _open_editor(session, gpu)

    # Instant validation with the domain's messages: two +me instances are refused.
    page.click('[data-preset="empty"]')
    page.click('.pl[data-profile="1g.10gb+me"][data-start="0"]')
    page.click('.pl[data-profile="1g.10gb+me"][data-start="1"]')
    bad = page.locator("#verdict.bad")
    bad.wait_for(timeout=15_000)
    assert "mig." in bad.inner_text()
    assert page.locator("#apply").is_disabled()

    page.click('[data-preset="halves"]')  # 3g.40gb at slices 0-3 and 4-7
    page.locator("#verdict.ok").wait_for(timeout=15_000)
    assert page.locator("#canvas .inst").count() == 2
    page.screenshot(path=str(screenshots / "layout-editor.png"), full_page=True)

    page.click("#apply")
    page.locator('#steps .st.done[data-step="succeeded"]').wait_for(timeout=20_000)
    current = page.locator("#current-card .slice")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#current-card .slice .p')]"
        ".map(n => n.textContent).join() === '3g.40gb,3g.40gb'",
        timeout=10_000,
    )
    assert current.count() == 2
    _, parts = session.api("GET", f"/api/v1/partitions/?gpu={gpu['id']}&limit=50")
    assert sorted((p["profile_name"], p["start"]) for p in parts["results"]) == [
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    ]
    page.screenshot(path=str(screenshots / "layout-editor-applied.png"), full_page=True)

    page.goto(session.stack.url + "/")  # the fleet view draws the new layout too
    fleet_card = page.locator(f"#gpu-{gpu['id']}")
    assert fleet_card.locator(".slice").count() == 2
    assert session.errors == []


def _mig_parts(session: Any, gpu_id: int) -> dict[int, dict[str, Any]]:
    _, parts = session.api("GET", f"/api/v1/partitions/?gpu={gpu_id}&limit=50")
    return {p["start"]: p for p in parts["results"] if p["kind"] == "mig"}


def test_3b_mps_inside_a_mig_instance_is_set_in_the_editor_and_kept_by_a_reshape(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    gpu = _idle_mig_gpu(session)
    page = _open_editor(session, gpu)
    page.click('[data-preset="halves"]')  # 3g.40gb (profile 9) at slices 0-3 and 4-7
    page.locator("#verdict.ok").wait_for(timeout=15_000)

    row = page.locator('.inst-mps-row[data-instance="9@4"]')
    row.get_by_role("checkbox").check()
    threads = row.locator('input[name="default_active_thread_percentage"]')
    threads.fill("40")
    threads.press("Tab")  # a change event: the policy is part of the edit
    assert not page.locator("#apply").is_disabled()
    page.screenshot(path=str(screenshots / "layout-editor-mps.png"), full_page=True)
    page.click("#apply")
    page.locator('#steps .st.done[data-step="succeeded"]').wait_for(timeout=20_000)
    parts = _mig_parts(session, gpu["id"])
    assert parts[4]["mps_enabled"] and parts[4]["mps_default_active_thread_percentage"] == 40
    assert not parts[0]["mps_enabled"]

    # Reshape the other half: the instance that stays keeps its MPS policy.
    page.wait_for_function(
        "() => document.querySelector('.inst-mps-row[data-instance=\"9@4\"] input').checked"
    )
    page.click('.pl[data-profile="3g.40gb"][data-start="0"]')  # remove the first half
    page.click('.pl[data-profile="1g.10gb"][data-start="0"]')
    page.locator("#verdict.ok").wait_for(timeout=15_000)
    # Live frames about this GPU re-read the editor's model: they must not wipe the edit (they
    # did, after a successful apply, when a frame came between the edit and the click).
    card = f"#gpu-{gpu['id']}"
    for action, flag in (("cordon", "1"), ("uncordon", "0")):
        status, _ = session.api("POST", f"/api/v1/gpus/{gpu['id']}/{action}", {"reason": "test"})
        assert status == 200, status
        page.wait_for_function(
            f"() => document.querySelector('{card}')?.dataset.cordoned === '{flag}'",
            timeout=10_000,
        )
    page.wait_for_function(
        "() => [...document.querySelectorAll('#canvas .inst')].length === 2"
        " && !!document.querySelector('#canvas .inst.new')",
        timeout=5_000,
    )
    page.click("#apply")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        parts = _mig_parts(session, gpu["id"])
        if sorted(parts) == [0, 4] and parts[0]["profile_name"] == "1g.10gb":
            break
        time.sleep(0.3)
    assert parts[0]["profile_name"] == "1g.10gb" and not parts[0]["mps_enabled"]
    assert parts[4]["mps_enabled"] and parts[4]["mps_default_active_thread_percentage"] == 40
    assert session.errors == []


class ProbeAgent:
    """A simulated agent this test controls: its own host, one H100, samples every 0.5 s."""

    def __init__(self, url: str, enrollment_token: str, state_dir: Path) -> None:
        from fleet.inventory.simulation import simulated_spec
        from fleet.mig import product_by_key
        from hostagent.client import AgentClient, enroll
        from hostagent.collector import Collector
        from hostagent.gpu.simulated import SimulatedBackend
        from hostagent.mps import MpsManager

        product = product_by_key("h100-sxm5-80gb")
        assert product is not None
        state = enroll(url, enrollment_token, "browser-probe", state_dir / "state.json")
        self.backend = SimulatedBackend([simulated_spec(product)], seed=99)
        self.backend.init()
        mps = MpsManager(self.backend.mps_control, state_dir / "mps")
        collector = Collector(self.backend, hostname="browser-probe", mps=mps, allow_mutation=True)
        self.client = AgentClient(
            server=url,
            state=state,
            backend=self.backend,
            collector=collector,
            mps=mps,
            allow_mutation=True,
            interval_s=0.5,
        )
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.loop.run_until_complete(self.client.run(self.stop))

    @property
    def gpu_uuid(self) -> str:
        return str(self.backend.list_gpus()[0].uuid)

    def __enter__(self) -> ProbeAgent:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=10)


@pytest.fixture
def probe(settled_fleet: Any, admin_token: str, tmp_path: Path) -> Iterator[ProbeAgent]:
    status, host = settled_fleet.api(
        "POST", "/api/v1/hosts/", admin_token, {"name": f"browser-probe-{int(time.time())}"}
    )
    assert status == 201, host
    with ProbeAgent(settled_fleet.url, host["enrollment_token"], tmp_path) as agent:
        agent.host_name = host["name"]
        yield agent


def test_4_a_telemetry_change_reaches_the_page_within_2_seconds(
    new_session: Any, probe: ProbeAgent, admin_token: str
) -> None:
    session = new_session("viewer")
    page = session.page
    deadline = time.monotonic() + 20
    gpu_id = None
    while gpu_id is None and time.monotonic() < deadline:
        path = f"/api/v1/gpus/?host_name={probe.host_name}"
        _, gpus = session.stack.api("GET", path, admin_token)
        gpu_id = gpus["results"][0]["id"] if gpus["results"] else None
        time.sleep(0.3)
    assert gpu_id is not None, "the probe agent's GPU never appeared"
    page.goto(f"{session.stack.url}/?q={probe.host_name}")
    session.wait_live()
    util = page.locator(f'#gpu-{gpu_id} [data-live="util"]')
    page.wait_for_function(
        f"() => document.querySelector('#gpu-{gpu_id} [data-live=\"util\"]')?.textContent === '0%'",
        timeout=10_000,
    )

    probe.backend.run_process(probe.gpu_uuid, 8192, compute_percent=90)  # the load jumps
    started = time.monotonic()
    page.wait_for_function(
        f"() => document.querySelector('#gpu-{gpu_id} [data-live=\"util\"]')?.textContent !== '0%'",
        timeout=5_000,
        polling=50,
    )
    elapsed = time.monotonic() - started
    assert elapsed <= 2.0, f"the change took {elapsed:.2f} s to reach the page"
    assert int(util.inner_text().rstrip("%")) >= 50
    assert page.locator(f"#gpu-{gpu_id}").get_attribute("data-heat") not in ("0", "na")
    assert session.errors == []


def test_4b_a_dropped_socket_reconnects_and_resyncs_without_a_reload(
    new_session: Any, admin_token: str
) -> None:
    session = new_session("viewer")
    page = session.page
    search(page, "h100-a04")
    gpu_id = int(card(page, "h100-a04/gpu5").get_attribute("data-gpu"))
    page.evaluate("() => { window.__sameDocument = true; }")
    # Drop the socket and hold the retry back so a change happens while the page is offline.
    page.evaluate("() => { window.fleetLive.attempt = 3; window.fleetLive.socket.close(); }")
    page.wait_for_selector('#live-status[data-state="reconnecting"]', timeout=15_000)
    status, _ = session.stack.api(
        "POST", f"/api/v1/gpus/{gpu_id}/cordon", admin_token, {"reason": "resync test"}
    )
    assert status == 200
    assert card(page, "h100-a04/gpu5").get_attribute("data-cordoned") == "0"  # still offline
    page.wait_for_selector('#live-status[data-state="live"]', timeout=15_000)
    page.wait_for_selector(f'#gpu-{gpu_id}[data-cordoned="1"]', timeout=15_000)
    assert page.evaluate("() => window.__sameDocument === true")  # no reload happened
    session.stack.api("POST", f"/api/v1/gpus/{gpu_id}/uncordon", admin_token)
    page.wait_for_selector(f'#gpu-{gpu_id}[data-cordoned="0"]', timeout=15_000)
    assert session.errors == []


def test_5_a_viewer_is_refused_an_operator_action(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    assert page.locator('.dep[draggable="true"]').count() == 0
    assert page.locator('.dep [data-action="place"]').count() == 0
    gpu_id = int(page.locator("article.gpu").first.get_attribute("data-gpu"))
    page.goto(f"{session.stack.url}/gpus/{gpu_id}/")
    cordon = page.locator('button[data-action="cordon"]')
    assert cordon.is_disabled()

    # Force the action anyway: the API refuses, and the page says so.
    page.evaluate("() => document.querySelector('button[data-action=\"cordon\"]').disabled = false")
    page.once("dialog", lambda dialog: dialog.accept("forced by a viewer"))
    cordon.click()
    refusal = page.locator(".toast.error")
    refusal.wait_for(timeout=15_000)
    assert "role does not allow" in refusal.inner_text()
    status, gpu = session.api("GET", f"/api/v1/gpus/{gpu_id}/")
    assert status == 200 and gpu["cordoned"] is False
    deployment = deployment_named(session, "qwen-14b-batch")
    status, body = session.api(
        "POST", f"/api/v1/deployments/{deployment['id']}/place", {"gpu": gpu_id}
    )
    assert status == 403 and body["code"]
    assert session.errors == []


def test_6_screenshots_of_the_fleet_and_a_gpu_detail(new_session: Any, screenshots: Path) -> None:
    session = new_session("operator")
    page = session.page
    time.sleep(2)
    page.screenshot(path=str(screenshots / "fleet.png"))
    status, allocations = session.api("GET", "/api/v1/allocations/?kind=mig&limit=500")
    assert status == 200
    by_gpu: dict[int, int] = {}
    for allocation in allocations["results"]:
        by_gpu[allocation["gpu"]] = by_gpu.get(allocation["gpu"], 0) + 1
    _, hoppers = session.api("GET", "/api/v1/gpus/?product=NVIDIA%20H&limit=500")
    hopper = {g["id"] for g in hoppers["results"]}  # H100/H200: per-instance utilisation (GPM)
    busiest = max(by_gpu, key=lambda g: (g in hopper, by_gpu[g]))
    page.goto(f"{session.stack.url}/gpus/{busiest}/")
    session.wait_live()
    time.sleep(3)  # a few live points on the charts
    assert page.locator("figure[data-chart] path.line").count() == 4
    page.screenshot(path=str(screenshots / "gpu-detail.png"), full_page=True)
    page.click('#range label:has(input[value="60"]) span')  # the last minute, closer up
    page.screenshot(path=str(screenshots / "gpu-detail-1min.png"), full_page=True)
    assert session.errors == []


SHOWN = """() => JSON.stringify([...document.querySelectorAll('article.gpu:not([hidden])')]
  .map(c => Number(c.dataset.gpu)).sort((a, b) => a - b))"""


def api_gpus(session: Any, params: dict[str, str]) -> list[int]:
    status, body = session.api("GET", f"/api/v1/gpus/?{urlencode({**params, 'limit': 1000})}")
    assert status == 200, body
    return sorted(g["id"] for g in body["results"])


def wait_shown(page: Any, expected: list[int]) -> None:
    """Until the cards on show are exactly ``expected``."""
    page.wait_for_function(
        f"(want) => ({SHOWN})() === want",
        arg=json.dumps(expected, separators=(",", ":")),
        timeout=10_000,
    )


def test_7_the_filters_show_the_gpus_the_api_filters_by_the_same_rules(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    config = page.evaluate("() => JSON.parse(document.getElementById('page-config').textContent)")
    filters = {f["name"]: f for f in config["gpu_filters"]}
    product = next(value for value, _ in filters["product"]["choices"] if "A30" in value)
    health = next(value for value, _ in filters["health"]["choices"] if value == "healthy")

    # In the browser, by the config's rules, with values from the config's choices.
    page.select_option('select[name="product"]', product)
    wait_shown(page, api_gpus(session, {"product": product}))
    page.select_option('select[name="health"]', health)
    wait_shown(page, api_gpus(session, {"product": product, "health": health}))
    page.click('.seg-control label:has(input[name="mode"][value="mps"]) span')
    wait_shown(page, api_gpus(session, {"product": product, "health": health, "mode": "mps"}))
    assert "mode=mps" in page.url and "health=healthy" in page.url
    page.click('.seg-control label:has(input[name="mode"][value=""]) span')
    page.select_option('select[name="product"]', "")
    page.click('label.toggle:has(input[name="free"]) span')
    wait_shown(page, api_gpus(session, {"health": health, "free": "true"}))

    # On the server, then in the browser again once a filter changes (all cards are loaded).
    page.goto(f"{session.stack.url}/?{urlencode({'product': product, 'mode': 'mig'})}")
    session.wait_live()
    wait_shown(page, api_gpus(session, {"product": product, "mode": "mig"}))
    page.select_option('select[name="product"]', "")
    wait_shown(page, api_gpus(session, {"mode": "mig"}))
    assert session.errors == []


def test_8_an_operator_creates_a_deployment_that_runs_a_container(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    page.click('[data-action="new-deployment"]')
    form = page.locator("#new-form")
    form.locator('input[name="name"]').fill("llm-serve")
    form.locator('input[name="profile"]').fill("1g.10gb")
    assert form.locator('input[name="image"]').is_hidden()  # runtime none: nothing to run
    form.locator('select[name="runtime"]').select_option("container")
    form.locator('input[name="image"]').fill("Not An Image")
    form.locator('button[type="submit"]').click()
    error = page.locator("#new-error")
    error.wait_for(timeout=10_000)
    assert "image" in error.inner_text().lower()
    _, body = session.api("GET", "/api/v1/deployments/?limit=500")
    assert all(d["name"] != "llm-serve" for d in body["results"])  # refused: nothing created

    form.locator('input[name="image"]').fill("registry.example/llm:1.2")
    form.locator('input[name="command"]').fill('serve --port 8000 --name "qwen 7b"')
    form.locator('textarea[name="env"]').fill("MODEL=qwen-7b\nLOG=debug")
    form.locator('select[name="health"]').select_option("http")
    form.locator('input[name="health_port"]').fill("8000")
    form.locator('input[name="health_path"]').fill("/health")
    form.locator('button[type="submit"]').click()
    page.locator('.dep[data-name="llm-serve"]').wait_for(timeout=15_000)
    workload = deployment_named(session, "llm-serve")["workload"]
    assert workload["runtime"] == "container"
    assert workload["command"] == ["serve", "--port", "8000", "--name", "qwen 7b"]
    assert workload["env"] == {"MODEL": "qwen-7b", "LOG": "debug"}
    assert workload["health"]["http"] == {"port": 8000, "path": "/health"}
    assert page.locator('.dep[data-name="llm-serve"] .chip.runtime').inner_text() == "container"
    assert session.errors == []
