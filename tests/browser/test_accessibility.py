"""Accessibility of the dashboard in a real browser: axe-core (WCAG 2.1 A and AA) on every page
under both colour schemes, and the header on a narrow screen.

axe-core comes from npm with a lock file (``npm ci`` at the repository root); the test injects it
into each page, the dashboard never loads it.

Run: ``.venv/bin/pytest tests/browser/test_accessibility.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import ROOT, Session, Stack

pytestmark = pytest.mark.browser

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
WCAG_21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
RUN_AXE = """(tags) => axe.run(document, {runOnly: {type: 'tag', values: tags}}).then(r =>
  r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                          targets: v.nodes.map(n => n.target.join(' '))})))"""
NARROW = {"width": 420, "height": 800}


@pytest.fixture
def a11y_session(chromium: Any, settled_fleet: Stack) -> Iterator[Callable[..., Session]]:
    """``new_session`` in a context that lets the test inject axe-core: the dashboard's
    Content-Security-Policy (``script-src 'self'``) refuses the inline script tag otherwise."""
    contexts = []

    def make(username: str, width: int = 1600, height: int = 1000) -> Session:
        context = chromium.new_context(viewport={"width": width, "height": height}, bypass_csp=True)
        contexts.append(context)
        return Session(context.new_page(), settled_fleet).login(username)

    yield make
    for context in contexts:
        context.close()


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """The WCAG 2.1 A/AA violations axe-core finds in the page as it is now."""
    if not AXE.exists():
        pytest.fail(f"{AXE.relative_to(ROOT)} is missing: run `npm ci` at the repository root")
    page.add_script_tag(path=str(AXE))
    return list(page.evaluate(RUN_AXE, WCAG_21_AA))


def readable(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']}")
        lines.extend(f"    {target}" for target in v["targets"][:15])
        if len(v["targets"]) > 15:
            lines.append(f"    … and {len(v['targets']) - 15} more")
    return "\n".join(lines)


def _mig_gpu_id(session: Session) -> int:
    status, body = session.api("GET", "/api/v1/gpus/?mode=mig&limit=1")
    assert status == 200 and body["results"], "the demo fleet has a GPU in MIG mode"
    return int(body["results"][0]["id"])


def _open_login(session: Session) -> None:
    session.page.context.clear_cookies()
    session.page.goto(session.stack.url + "/login/")


def _open_fleet(session: Session) -> None:
    status, body = session.api("GET", "/api/v1/deployments/?limit=1")
    assert status == 200 and body["results"], "the demo fleet has a deployment in the tray"
    session.page.goto(session.stack.url + "/")
    session.wait_live()
    session.page.wait_for_selector("#tray .dep", state="attached")
    # Hosts off screen skip rendering (content-visibility: auto), and axe skips what is not
    # rendered: draw every host so that every GPU card is checked.
    session.page.add_style_tag(content=".host { content-visibility: visible !important; }")


def _open_tray(session: Session) -> None:
    """On a narrow screen the tray is a drawer: open it."""
    toggle = session.page.locator(".tray-toggle")
    if toggle.is_visible():
        toggle.click()
    session.page.wait_for_selector("#tray .dep")


def _open_new_deployment_dialog(session: Session) -> None:
    _open_fleet(session)
    _open_tray(session)
    session.page.click('[data-action="new-deployment"]')
    session.page.wait_for_selector("#new-dialog[open]")


def _open_place_dialog(session: Session) -> None:
    _open_fleet(session)
    _open_tray(session)
    session.page.locator('#tray .dep [data-action="place"]').first.click()
    session.page.wait_for_selector("#place-dialog[open] #place-targets .target")


def _open_gpu(session: Session) -> None:
    session.page.goto(f"{session.stack.url}/gpus/{_mig_gpu_id(session)}/")
    session.wait_live()


def _open_layout(session: Session) -> None:
    session.page.goto(f"{session.stack.url}/gpus/{_mig_gpu_id(session)}/layout/")
    session.wait_live()
    session.page.wait_for_selector("#palette .pl")
    session.page.wait_for_selector("#verdict:not(.wait)")


def _open_operations(session: Session) -> None:
    session.page.goto(session.stack.url + "/operations/")
    session.wait_live()


def _open_deployments(session: Session) -> None:
    session.page.goto(session.stack.url + "/deployments/")
    session.wait_live()


def _open_deployment(session: Session) -> None:
    status, body = session.api("GET", "/api/v1/deployments/?limit=500")
    assert status == 200 and body["results"]
    placed = [d for d in body["results"] if d["placed_replicas"]] or body["results"]
    session.page.goto(f"{session.stack.url}/deployments/{placed[0]['id']}/")
    session.wait_live()


def _open_deployment_waiting(session: Session) -> None:
    """A deployment with a waiting replica: its what-would-it-take panel drawn."""
    status, body = session.api("GET", "/api/v1/queue/")
    assert status == 200 and body["waiting"], "the demo fleet has a waiting replica"
    session.page.goto(f"{session.stack.url}/deployments/{body['waiting'][0]['deployment']}/")
    session.wait_live()
    session.page.wait_for_selector('#wit-box[data-wit-state="ready"] .wit-plan')


def _open_wit_dialog(session: Session) -> None:
    _open_fleet(session)
    _open_tray(session)
    session.page.locator('#tray .dep [data-action="wit"]').first.click()
    session.page.wait_for_selector("#wit-dialog[open] .wit-plan")


def _open_capacity(session: Session) -> None:
    session.page.goto(session.stack.url + "/capacity/")
    session.wait_live()


def _open_repack_proposal(session: Session) -> None:
    _open_capacity(session)
    session.page.get_by_role("button", name="Propose", exact=True).click()
    session.page.locator("#repack-plan .repack-summary").wait_for(timeout=20_000)


def _open_fleet_highlighted(session: Session) -> None:
    _, gpus = session.api("GET", "/api/v1/gpus/?limit=3")
    ids = ",".join(str(g["id"]) for g in gpus["results"])
    session.page.goto(f"{session.stack.url}/?highlight={ids}")
    session.wait_live()
    session.page.locator("#highlight-note").wait_for(state="visible")
    session.page.add_style_tag(content=".host { content-visibility: visible !important; }")


def _open_hosts(session: Session) -> None:
    session.page.goto(session.stack.url + "/hosts/")
    session.wait_live()


def _open_host(session: Session) -> None:
    status, body = session.api("GET", "/api/v1/hosts/?limit=1")
    assert status == 200 and body["results"]
    session.page.goto(f"{session.stack.url}/hosts/{body['results'][0]['id']}/")
    session.wait_live()


def _open_confirm_dialog(session: Session) -> None:
    """The one confirm dialog of destructive actions (confirm.js), open on a host's Drain."""
    _open_host(session)
    session.page.get_by_role("button", name="Drain", exact=True).click()
    session.page.get_by_role("alertdialog").wait_for()


def _open_not_found(session: Session) -> None:
    session.page.goto(session.stack.url + "/deployments/987654321/")  # the styled 404
    session.page.wait_for_selector("#not-found")


def _open_no_access(session: Session) -> None:
    session.page.goto(session.stack.url + "/alerts/")  # admins only: the styled 403
    session.page.wait_for_selector("#no-access")


def _open_rollouts(session: Session) -> None:
    session.page.goto(session.stack.url + "/rollouts/")
    session.wait_live()


def _open_teams(session: Session) -> None:
    session.page.goto(session.stack.url + "/teams/")
    session.wait_live()


def _open_team(session: Session) -> None:
    status, body = session.api("GET", "/api/v1/teams/")
    assert status == 200 and body["results"]
    session.page.goto(f"{session.stack.url}/teams/{body['results'][0]['id']}/")
    session.wait_live()


def _open_usage(session: Session) -> None:
    session.page.goto(session.stack.url + "/usage/")  # server-rendered, no live script
    session.page.wait_for_selector("#usage-table")


PAGES: dict[str, Callable[[Session], None]] = {
    "login": _open_login,
    "fleet": _open_fleet,
    "fleet-new-deployment-dialog": _open_new_deployment_dialog,
    "fleet-place-dialog": _open_place_dialog,
    "fleet-wit-dialog": _open_wit_dialog,
    "gpu": _open_gpu,
    "layout": _open_layout,
    "operations": _open_operations,
    "deployments": _open_deployments,
    "deployment": _open_deployment,
    "deployment-what-would-it-take": _open_deployment_waiting,
    "capacity": _open_capacity,
    "capacity-repack-proposal": _open_repack_proposal,
    "fleet-highlighted": _open_fleet_highlighted,
    "hosts": _open_hosts,
    "host": _open_host,
    "host-confirm-dialog": _open_confirm_dialog,
    "not-found": _open_not_found,
    "no-access": _open_no_access,
    "rollouts": _open_rollouts,
    "teams": _open_teams,
    "team": _open_team,
    "usage": _open_usage,
}


@pytest.mark.parametrize("scheme", ["dark", "light"])
@pytest.mark.parametrize("name", list(PAGES))
def test_axe_finds_no_wcag_21_aa_violation_on_the_page(
    a11y_session: Callable[..., Session], screenshots: Path, name: str, scheme: str
) -> None:
    session = a11y_session("operator")
    session.page.emulate_media(color_scheme=scheme)
    PAGES[name](session)

    violations = axe_violations(session.page)

    session.page.screenshot(path=str(screenshots / f"a11y-{name}-{scheme}.png"), full_page=True)
    assert violations == [], f"axe on the {name} page ({scheme}):\n{readable(violations)}"
    assert session.errors == []


@pytest.mark.parametrize("scheme", ["dark", "light"])
@pytest.mark.parametrize("name", ["fleet", "gpu", "layout", "host"])
def test_axe_finds_no_violation_on_the_pages_a_viewer_sees(
    a11y_session: Callable[..., Session], name: str, scheme: str
) -> None:
    session = a11y_session("viewer")  # no operator controls: disabled buttons, nothing to drag
    session.page.emulate_media(color_scheme=scheme)
    PAGES[name](session)

    violations = axe_violations(session.page)

    assert violations == [], (
        f"axe on the {name} page as a viewer ({scheme}):\n{readable(violations)}"
    )


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_axe_finds_no_violation_in_the_log_viewer_with_lines_times_and_matches(
    a11y_session: Callable[..., Session], screenshots: Path, scheme: str
) -> None:
    session = a11y_session("operator")
    session.page.emulate_media(color_scheme=scheme)
    status, free = session.api(
        "GET", "/api/v1/partitions/?kind=mig&free=true&profile_name=1g.10gb&limit=1"
    )
    assert status == 200 and free["results"], free
    workload = {"runtime": "process", "command": ["/bin/sh", "-c", "echo ready; sleep 600"]}
    status, created = session.api(
        "POST",
        "/api/v1/deployments/",
        {"name": f"a11y-logs-{scheme}", "kind": "mig", "profile": "1g.10gb", "workload": workload},
    )
    assert status == 201, created
    try:
        status, op = session.api(
            "POST",
            f"/api/v1/deployments/{created['id']}/place",
            {"partition": free["results"][0]["id"]},
        )
        assert status == 202, op
        page = session.page
        page.goto(f"{session.stack.url}/deployments/{created['id']}/")
        session.wait_live()
        page.locator("#dep-logs > summary").click()
        page.locator("#logs-output .log-line").first.wait_for(timeout=30_000)
        page.locator("#logs-search").fill("read")  # a highlighted match

        violations = axe_violations(page)

        page.screenshot(path=str(screenshots / f"a11y-deployment-logs-{scheme}.png"))
        assert violations == [], f"axe on the log viewer ({scheme}):\n{readable(violations)}"
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{created['id']}/")


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_axe_finds_no_violation_on_the_alerts_page_an_admin_sees(
    a11y_session: Callable[..., Session], scheme: str
) -> None:
    session = a11y_session("admin")
    session.page.emulate_media(color_scheme=scheme)
    session.page.goto(session.stack.url + "/alerts/")
    session.page.wait_for_selector("#deliveries")

    violations = axe_violations(session.page)

    assert violations == [], f"axe on the alerts page ({scheme}):\n{readable(violations)}"
    assert session.errors == []


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_axe_finds_no_violation_on_gpu_cards_of_an_offline_host(
    a11y_session: Callable[..., Session], scheme: str
) -> None:
    session = a11y_session("operator")
    session.page.emulate_media(color_scheme=scheme)
    _open_fleet(session)
    # The demo's agents stay up: draw every card as the server draws one on an offline host.
    session.page.evaluate(
        "document.querySelectorAll('article.gpu').forEach(c => c.classList.add('is-offline'))"
    )

    violations = axe_violations(session.page)

    assert violations == [], f"axe on offline GPU cards ({scheme}):\n{readable(violations)}"


def _overflowing(page: Any, selector: str) -> list[str]:
    """The visible elements under ``selector`` that reach outside the viewport's width."""
    return list(
        page.evaluate(
            """(selector) => [...document.querySelectorAll(selector)].filter(e => {
                const r = e.getBoundingClientRect();
                return r.width > 0 && (r.left < 0 || r.right > window.innerWidth);
              }).map(e => e.outerHTML.slice(0, 120))""",
            selector,
        )
    )


@pytest.mark.parametrize(
    "name",
    [
        "fleet",
        "gpu",
        "layout",
        "operations",
        "deployments",
        "deployment",
        "capacity",
        "hosts",
        "host",
        "rollouts",
        "teams",
        "team",
    ],
)
def test_the_header_fits_a_420_px_screen_with_every_control_usable(
    a11y_session: Callable[..., Session], screenshots: Path, name: str
) -> None:
    session = a11y_session("operator", **NARROW)
    page = session.page
    PAGES[name](session)
    page.screenshot(path=str(screenshots / f"a11y-{name}-420.png"))

    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"], _overflowing(
        page, "main *"
    )[:5]
    assert _overflowing(page, ".topbar, .topbar *") == []
    logout = page.get_by_role("button", name="Log out")
    box = logout.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= NARROW["width"]
    assert page.locator(".topbar .whoami").is_visible()
    logout.click()  # nothing covers it: the click lands and signs out
    page.wait_for_url(re.compile(r"/login/"))
    assert session.errors == []
