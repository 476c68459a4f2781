"""The new-deployment form shows the chosen team's policy (GET /api/v1/teams/{id}/policy):
runtimes, registries, users, host memory and PID maxima, host network. It only shows it: a
workload the policy forbids is still the server's 422 ``policy.*``, shown in the form.

Run: ``.venv/bin/pytest tests/browser -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser

POLICY = {
    "runtimes": ["container"],
    "registries": ["registry.example.com/vision/"],
    "uids": [[2000, 2999]],
    "max_host_memory_mib": 8192,
    "default_host_memory_mib": 4096,
    "max_pids": 512,
    "host_network": True,
}


def _row(box: Any, key: str) -> str:
    return str(box.locator(f'dd[data-policy="{key}"]').inner_text())


def test_the_form_shows_the_chosen_teams_policy_and_the_server_still_refuses(
    new_session: Any,
) -> None:
    admin = new_session("admin")
    status, team = admin.api("POST", "/api/v1/teams/", {"name": "policy-vision"})
    assert status == 201, team
    status, body = admin.api("PUT", f"/api/v1/teams/{team['id']}/policy", POLICY)
    assert status == 200, body

    session = new_session("operator")  # signed in after the team exists: the form lists it
    page = session.page
    page.click('[data-action="new-deployment"]')
    form = page.locator("#new-form")
    box = form.locator("#new-policy")
    box.wait_for(state="visible", timeout=10_000)
    assert box.get_attribute("data-team") == "default"  # the default team's, to begin with
    assert "process" in _row(box, "runtimes")  # the demo's team runs processes

    form.locator('select[name="team"]').select_option(label="policy-vision")
    page.wait_for_function(
        "() => document.querySelector('#new-policy')?.dataset.team === 'policy-vision'",
        timeout=10_000,
    )
    assert _row(box, "runtimes") == "none, container"
    assert _row(box, "registries") == "registry.example.com/vision/"
    assert _row(box, "users") == "uids 2000\u20132999 (never root)"
    assert _row(box, "host-memory") == "up to 8 GiB a replica (default 4 GiB)"
    assert _row(box, "pids") == "up to 512 a replica"
    assert _row(box, "host-network") == "yes"
    process = form.locator('select[name="runtime"] option[value="process"]')
    assert "not allowed" in process.inner_text()

    # Shown, not enforced here: the server refuses an image from another registry.
    form.locator('input[name="name"]').fill("vision-serve")
    form.locator('input[name="profile"]').fill("1g.10gb")
    form.locator('select[name="runtime"]').select_option("container")
    form.locator('input[name="image"]').fill("docker.io/library/python:3.11")
    form.locator('button[type="submit"]').click()
    error = page.locator("#new-error")
    error.wait_for(timeout=10_000)
    assert "registry.example.com/vision/" in error.inner_text()
    _, listed = session.api("GET", "/api/v1/deployments/?limit=500")
    assert all(d["name"] != "vision-serve" for d in listed["results"])

    form.locator('select[name="team"]').select_option("default")
    page.wait_for_function(
        "() => document.querySelector('#new-policy')?.dataset.team === 'default'",
        timeout=10_000,
    )
    assert "not allowed" not in process.inner_text()
    assert session.errors == []
