"""Mixed versions on real processes (issue 26): the previous release's agent, exported from git
as it was released, talks to this server (daphne, a Celery worker, PostgreSQL, Redis): it
enrols, its MIG layout is applied and a replica is placed. An agent two protocols behind is
refused at its hello, and the host's page says what to upgrade."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from fleet.inventory.simulation import simulated_spec
from fleet.mig import product_by_key
from hostagent import protocol
from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
# The last release: agent 0.1.0, protocol 1 (hostagent.protocol.AGENT_RELEASES). Move it on at
# each release whose protocol changes.
PREVIOUS_RELEASE = "d42df098848e7ef1b9d2ce961c3f69e4bcaafc2a"


def export_agent(commit: str, into: Path) -> Path:
    """``hostagent/`` as it was at ``commit`` (the repository's own history: a full clone)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "hostagent"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, (
        f"git archive {commit} failed ({archive.stderr.decode().strip()}): the mixed-version "
        "test needs the repository's history (a full clone, not a shallow one)"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def start_agent(stack: Stack, code: Path, name: str, enrollment: str) -> subprocess.Popen[bytes]:
    home = stack.tmp / f"agent-{name}"
    home.mkdir()
    spec = simulated_spec(product_by_key("h100-sxm5-80gb"))  # type: ignore[arg-type]
    (home / "gpus.json").write_text(json.dumps({"seed": 5, "gpus": [spec]}))
    args = [sys.executable, "-m", "hostagent", "--server", stack.url]
    args += ["--token-file", str(home / "token.json"), "--simulate", str(home / "gpus.json")]
    args += ["--allow-mutation", "--interval", "0.5", "--hostname", name]
    args += ["--mps-dir", str(home / "mps"), "--enroll", enrollment, "--transport", "ws"]
    log = (home / "agent.log").open("ab")
    env = {**stack.env, "PYTHONPATH": str(code)}  # the exported agent, not this checkout's
    return subprocess.Popen(args, cwd=code, stdout=log, stderr=subprocess.STDOUT, env=env)


def enrol(stack: Stack, name: str) -> dict[str, Any]:
    status, host = stack.request("POST", "/api/v1/hosts/", {"name": name}, token="admin")
    assert status == 201, host
    return dict(host)


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> Path:
    code = export_agent(PREVIOUS_RELEASE, tmp_path_factory.mktemp("previous-agent"))
    text = (code / "hostagent" / "protocol" / "messages.py").read_text()
    (spoken,) = re.findall(r"^PROTOCOL_VERSION = (\d+)$", text, re.M)
    assert int(spoken) == protocol.OLDEST_PROTOCOL  # one behind: the case that must work
    return code


def test_the_previous_release_s_agent_enrols_applies_a_layout_and_runs_a_place(stack, previous):
    host = enrol(stack, "prev-1")
    agent = start_agent(stack, previous, "prev-1", host["enrollment_token"])
    try:
        gpus = wait_until(
            lambda: stack.get(f"/api/v1/gpus/?host={host['id']}")["results"], 30, what="GPUs"
        )
        seen = stack.get(f"/api/v1/hosts/{host['id']}/")
        assert (seen["agent_version"], seen["agent_protocol"]) == ("0.1.0", 1)
        assert seen["agent_problem"] == ""
        layout = {"mode": "mig", "instances": [{"profile": "3g.40gb", "start": 0}]}
        status, op = stack.request("PUT", f"/api/v1/gpus/{gpus[0]['id']}/layout", layout)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
        wait_until(lambda: stack.converged(gpus[0]["id"]), 20, what="the MIG layout")
        body = {"name": "prev-dep", "replicas": 1, "kind": "mig", "profile": "3g.40gb"}
        status, created = stack.request("POST", "/api/v1/deployments/", body)
        assert status == 201, created
        target = {"gpu": gpus[0]["id"]}
        status, op = stack.request("POST", f"/api/v1/deployments/{created['id']}/place", target)
        assert status == 202, op
        assert stack.wait_operation(op["id"])["status"] == "succeeded"
        host_now = stack.get(f"/api/v1/hosts/{host['id']}/")
        assert host_now["applied_generation"] == host_now["desired_generation"] > 0
    finally:
        agent.kill()


def test_an_agent_two_protocols_behind_is_refused_and_its_host_says_upgrade(
    stack, previous, tmp_path_factory
):
    ancient = export_agent(PREVIOUS_RELEASE, tmp_path_factory.mktemp("ancient-agent"))
    messages = ancient / "hostagent" / "protocol" / "messages.py"
    stale = protocol.OLDEST_PROTOCOL - 1
    text = re.sub(
        r"^PROTOCOL_VERSION = \d+$", f"PROTOCOL_VERSION = {stale}", messages.read_text(), flags=re.M
    )
    messages.write_text(text)
    host = enrol(stack, "ancient-1")
    agent = start_agent(stack, ancient, "ancient-1", host["enrollment_token"])
    try:
        seen = wait_until(
            lambda: (h := stack.get(f"/api/v1/hosts/{host['id']}/"))["agent_problem"] and h,
            30,
            what="the refusal on the host",
        )
        assert "upgrade the agent on this host" in seen["agent_problem"]
        assert seen["status"] == "offline" and seen["gpu_count"] == 0
        log = stack.tmp / "agent-ancient-1" / "agent.log"
        wait_until(lambda: "agent.protocol_unsupported" in log.read_text(), 10, what="its log")
        assert agent.poll() is None  # it keeps running, trying again rarely
    finally:
        agent.kill()
