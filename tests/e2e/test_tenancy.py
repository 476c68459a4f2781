"""Tenancy on the real processes: a team operator's process workload runs as its policy's user,
not root, and cannot read its agent's token; another team reads neither its workload, nor its
logs, nor its secrets; a secret's value reaches the workload and is masked in its logs.

Issue 21's first finding: "A team operator (no fleet role) created a process workload. Its log
showed uid=0, and it read the agents' host token files." And its second: containers ran as the
image's user with Docker's default capabilities, no ``no-new-privileges`` and no limits: here a
container of the team runs on a real Docker Engine with the restricted profile.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.stack import NOBODY, Agent, Stack, running, wait_until
from tests.e2e.test_workloads import containers_of, image  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SECRET_VALUE = "hf_tenancy_0123456789"


@pytest.fixture(scope="module")
def tenancy(stack: Stack) -> dict[str, Any]:
    agent = stack.add_agent("tn-1", ["a100-sxm4-40gb"], runtime="process")
    teams = {}
    for name in ("tenant-a", "tenant-b"):
        status, team = stack.request("POST", "/api/v1/teams/", {"name": name}, token="admin")
        assert status == 201, team
        user_id, token = stack.team_user(f"{name}-op")
        status, body = stack.request(
            "PUT",
            f"/api/v1/teams/{team['id']}/members",
            {"members": [{"user": user_id, "role": "operator"}]},
            token="admin",
        )
        assert status == 200, body
        teams[name] = {"id": team["id"], "token": token}
    return {"agent": agent, **teams}


def _create(stack: Stack, token: str, name: str, workload: dict[str, Any]) -> tuple[int, Any]:
    body = {"name": name, "kind": "gpu", "gpu_count": 1, "team": name.rsplit("-", 1)[0]}
    return stack.request("POST", "/api/v1/deployments/", {**body, "workload": workload}, token)


def test_the_restricted_default_policy_refuses_processes_and_root(stack, tenancy):
    token = tenancy["tenant-a"]["token"]
    status, body = _create(
        stack, token, "tenant-a-proc", {"runtime": "process", "command": ["/bin/id"]}
    )
    assert status == 422 and body["code"] == "policy.runtime_denied", body
    status, body = _create(
        stack,
        token,
        "tenant-a-root",
        {"runtime": "container", "image": "docker.io/library/busybox:1", "user": "0:0"},
    )
    assert status == 422 and body["code"] == "policy.user_denied", body
    # Only a fleet admin sets a policy: the team's own operator cannot lift it.
    status, body = stack.request(
        "PUT",
        f"/api/v1/teams/{tenancy['tenant-a']['id']}/policy",
        {"runtimes": ["process"], "allow_root": True},
        token,
    )
    assert status == 403, body
    assert stack.get("/api/v1/deployments/?team=tenant-a")["count"] == 0


def test_a_team_process_runs_as_its_policy_user_and_another_team_sees_none_of_it(
    stack: Stack, tenancy: dict[str, Any]
) -> None:
    a, b = tenancy["tenant-a"], tenancy["tenant-b"]
    agent: Agent = tenancy["agent"]
    status, policy = stack.request(
        "PUT",
        f"/api/v1/teams/{a['id']}/policy",
        {"runtimes": ["process"], "process_user": NOBODY},
        token="admin",
    )
    assert status == 200, policy
    status, secret = stack.request(
        "POST",
        f"/api/v1/teams/{a['id']}/secrets",
        {"name": "hf", "value": SECRET_VALUE},
        a["token"],
    )
    assert status == 201, secret
    assert SECRET_VALUE not in json.dumps(secret)

    # What the review's workload did: say who it is, read the agent's host token, print its env.
    script = (
        f"echo uid=$(id -u); cat {agent.token_file}; echo token-read=$?; "
        "echo hf=$HF_TOKEN; exec sleep 3600"
    )
    status, created = _create(
        stack,
        a["token"],
        "tenant-a-probe",
        {
            "runtime": "process",
            "command": ["/bin/sh", "-c", script],
            "env": {"HF_TOKEN": {"secret": "hf"}},
            "stop_grace_s": 1,
        },
    )
    assert status == 201, created
    deployment_id = created["id"]
    gpu_id = stack.gpus(agent)[0]["id"]
    status, op = stack.request(
        "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpu_id}, a["token"]
    )
    assert status in (200, 201, 202), op
    try:
        (replica,) = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
        logs_path = f"/api/v1/allocations/{replica['id']}/logs?tail=50"

        def printed() -> list[str] | None:
            status, body = stack.request("GET", logs_path, token=a["token"])
            assert status == 200, body
            lines = [line for line in body["lines"] if not line.startswith("fleet: ")]
            return lines if any(line.startswith("hf=") for line in lines) else None

        lines = wait_until(printed, 30, what="the probe's lines")
        assert "uid=65534" in lines, lines  # the policy's user, not root
        assert "token-read=1" in lines, lines  # cat failed: the agent's token is out of reach
        stored = json.loads(agent.token_file.read_text())
        secrets_of_agent = [v for v in stored.values() if isinstance(v, str) and len(v) >= 16]
        assert secrets_of_agent and not any(v in "\n".join(lines) for v in secrets_of_agent)
        # The secret reached the workload and its value is masked in the logs.
        assert "hf=***" in lines and SECRET_VALUE not in json.dumps(lines), lines

        # Another team's operator: the deployment as a name and a runtime, no logs, no secrets.
        status, seen = stack.request(
            "GET", f"/api/v1/deployments/{deployment_id}/", token=b["token"]
        )
        assert status == 200 and seen["workload"] == {"runtime": "process", "redacted": True}
        status, body = stack.request("GET", logs_path, token=b["token"])
        assert status == 403 and body["code"] == "auth.forbidden", body
        status, body = stack.request("GET", f"/api/v1/teams/{a['id']}/secrets", token=b["token"])
        assert status == 403, body
        # Nor can it run as tenant-a's team or act on its deployment.
        status, body = stack.request(
            "POST", f"/api/v1/deployments/{deployment_id}/evict", {}, b["token"]
        )
        assert status == 403, body
        # The secret's value is nowhere but in the workload's environment: not in any answer
        # the team's own operator or a fleet admin reads, the audit CSV included, nor in any
        # file the agent keeps (its state, the replica's log).
        for path in (
            f"/api/v1/deployments/{deployment_id}/",
            f"/api/v1/allocations/?deployment={deployment_id}",
            f"/api/v1/operations/?deployment={deployment_id}",
            f"/api/v1/teams/{a['id']}/secrets",
        ):
            for token in (a["token"], "admin"):
                status, body = stack.request("GET", path, token=token)
                assert status == 200 and SECRET_VALUE not in json.dumps(body), (path, body)
        csv = stack.raw("GET", "/api/v1/operations/?format=csv", token="admin")
        assert csv and SECRET_VALUE.encode() not in csv
        # The agent's files: its token, its replica store, its own log. Not the replica's raw
        # output (workloads/logs/), which holds what the workload printed, the value included
        # here, as its process wrote it (0600 in the agent's 0700 state directory, read by the
        # agent only, and masked before any line leaves it: see the logs above).
        kept = [
            p
            for p in agent.dir.rglob("*")
            if p.is_file() and "logs" not in p.relative_to(agent.dir).parts
        ]
        assert len(kept) >= 3 and not any(SECRET_VALUE.encode() in p.read_bytes() for p in kept)
        # The team's own operator reads the secret's name, never its value.
        status, listed = stack.request("GET", f"/api/v1/teams/{a['id']}/secrets", token=a["token"])
        assert status == 200 and [s["name"] for s in listed] == ["hf"], listed
    finally:
        stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/", token="admin")
        wait_until(
            lambda: not stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"],
            20,
            what="the probe stopped",
        )


def test_a_host_reserved_for_another_team_takes_none_of_this_teams_replicas(
    stack: Stack, tenancy: dict[str, Any]
) -> None:
    a = tenancy["tenant-a"]
    agent: Agent = tenancy["agent"]
    host_id = stack.gpus(agent)[0]["host"]
    status, body = stack.request(
        "PUT", f"/api/v1/hosts/{host_id}/reservation", {"teams": ["tenant-b"]}, a["token"]
    )
    assert status == 403, body  # only a fleet admin reserves a host
    status, body = stack.request(
        "PUT", f"/api/v1/hosts/{host_id}/reservation", {"teams": ["tenant-b"]}, token="admin"
    )
    assert status == 200, body
    try:
        status, created = _create(stack, a["token"], "tenant-a-idle", {"runtime": "none"})
        assert status == 201, created
        status, body = stack.request(
            "POST",
            f"/api/v1/deployments/{created['id']}/place",
            {"gpu": stack.gpus(agent)[0]["id"]},
            a["token"],
        )
        assert status == 422 and body["code"] == "placement.host_reserved", body
        assert not stack.get(f"/api/v1/allocations/?deployment={created['id']}")["results"]
    finally:
        stack.request("PUT", f"/api/v1/hosts/{host_id}/reservation", {"teams": []}, token="admin")


def test_a_team_at_its_quota_moves_one_replica_at_a_time_never_more(
    stack: Stack, tenancy: dict[str, Any], tmp_path: Any
) -> None:
    """Issue 21: "A team held twice its quota by moving replicas." The team's first move in
    flight is its one surge replica; a second, while the first's new copy has not passed its
    health check, would hold quota + 2 and is refused with the move in flight named."""
    a = tenancy["tenant-a"]
    agent = stack.add_agent("tq-1", ["a100-sxm4-40gb"] * 4, runtime="process")
    gpus = [g["id"] for g in stack.gpus(agent)]
    status, policy = stack.request(
        "PUT",
        f"/api/v1/teams/{a['id']}/policy",
        {"runtimes": ["process"], "process_user": NOBODY},
        token="admin",
    )
    assert status == 200, policy
    status, body = stack.request("PUT", f"/api/v1/teams/{a['id']}/quota", {"gpus": 2}, "admin")
    assert status == 200, body
    ready = tmp_path / "ready"
    ready.mkdir()
    ready.chmod(0o755)
    # A copy is healthy once the test says so: the new copies of the moves below never are, so
    # each move stays in flight (its new copy is starting) until it times out or is cancelled.
    status, created = _create(
        stack,
        a["token"],
        "tenant-a-movers",
        {
            "runtime": "process",
            "command": ["/bin/sleep", "3600"],
            "health": {
                "exec": {"command": ["/bin/sh", "-c", f"test -f {ready}/$FLEET_ALLOCATION_ID"]},
                "interval_s": 1,
                "timeout_s": 1,
            },
            "stop_grace_s": 1,
        },
    )
    assert status == 201, created
    deployment_id = created["id"]
    try:
        status, body = stack.request(
            "PATCH", f"/api/v1/deployments/{deployment_id}/", {"replicas": 2}, a["token"]
        )
        assert status == 200, body
        for gpu in gpus[:2]:
            status, op = stack.request(
                "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpu}, a["token"]
            )
            assert status in (200, 201, 202), op
        replicas = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
        assert len(replicas) == 2, replicas
        for replica in replicas:
            (ready / str(replica["id"])).touch()
        wait_until(lambda: running(stack, deployment_id) == 2, 30, what="2 running")
        # A third replica is past the quota: refused at the door.
        status, body = stack.request(
            "PATCH", f"/api/v1/deployments/{deployment_id}/", {"replicas": 3}, a["token"]
        )
        if status == 200:
            status, body = stack.request(
                "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpus[2]}, a["token"]
            )
        assert status == 422 and body["code"] == "quota.exceeded", body
        first, second = sorted(replicas, key=lambda r: r["id"])
        status, op = stack.request(
            "POST",
            f"/api/v1/allocations/{first['id']}/move",
            {"gpu": gpus[2], "timeout_s": 120},
            a["token"],
        )
        assert status == 202, op  # the team's surge replica
        wait_until(
            lambda: (
                len(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]) == 3
            ),
            20,
            what="the first move's new copy",
        )
        status, body = stack.request(
            "POST",
            f"/api/v1/allocations/{second['id']}/move",
            {"gpu": gpus[3], "timeout_s": 120},
            a["token"],
        )
        assert status == 422 and body["code"] == "quota.exceeded", body
        assert body["details"]["surge_in_use"] is True
        assert [m["operation"] for m in body["details"]["moving"]] == [op["id"]], body
        held = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
        assert len(held) == 3, held  # quota (2) + the one surge copy, never more
        assert stack.operation(op["id"])["status"] in ("pending", "dispatched", "running")
    finally:
        stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/", token="admin")
        stack.request("PUT", f"/api/v1/teams/{a['id']}/quota", {"gpus": None}, "admin")
        wait_until(
            lambda: not stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"],
            20,
            what="the movers stopped",
        )


def test_a_team_container_runs_restricted_and_cannot_ask_for_root(
    stack: Stack,
    tenancy: dict[str, Any],
    image: str,  # noqa: F811
) -> None:
    """Root is refused at the door (422, the rule named); the container the team may run has
    no capabilities, ``no-new-privileges``, a PID and a memory limit, its own network, a
    read-only view of nothing of the agent's: it cannot read the host token nor reach Docker."""
    a = tenancy["tenant-a"]
    agent = stack.add_agent("tc-1", ["a100-sxm4-40gb"], runtime="docker")
    status, policy = stack.request(
        "PUT", f"/api/v1/teams/{a['id']}/policy", {"runtimes": ["container"]}, token="admin"
    )
    assert status == 200 and policy["allow_root"] is False and not policy["host_network"], policy
    probe = {
        "runtime": "container",
        "image": image,
        "command": ["sh", "-c", "sleep 3600"],
        "stop_grace_s": 1,
    }
    for user in ("0", "0:0", "1000:0"):
        status, body = _create(stack, a["token"], "tenant-a-root", {**probe, "user": user})
        assert status == 422 and body["code"] == "policy.user_denied", (user, body)
        assert "root" in body["message"], body
    # An image without a user of its own runs as root: refused too, with what to change.
    status, body = _create(stack, a["token"], "tenant-a-root", probe)
    assert status == 201, body  # the image's user is known only on the host: checked there
    refused_id = body["id"]
    script = (
        "echo uid=$(id -u); grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        f"cat {agent.token_file}; echo token-read=$?; "
        "test -e /var/run/docker.sock; echo docker-sock=$?; "
        "cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max; exec sleep 3600"
    )
    status, created = _create(
        stack,
        a["token"],
        "tenant-a-box",
        {**probe, "user": "1000:1000", "command": ["sh", "-c", script]},
    )
    assert status == 201, created
    deployment_id = created["id"]
    gpu_id = stack.gpus(agent)[0]["id"]
    try:
        status, op = stack.request(
            "POST", f"/api/v1/deployments/{refused_id}/place", {"gpu": gpu_id}, a["token"]
        )
        assert status in (200, 201, 202), op
        (rootish,) = stack.get(f"/api/v1/allocations/?deployment={refused_id}")["results"]
        failed = wait_until(
            lambda: (
                row
                if (row := stack.get(f"/api/v1/allocations/{rootish['id']}/"))["workload_state"]
                == "failed"
                else None
            ),
            60,
            what="the image's root user refused on the host",
        )
        assert "root" in failed["message"], failed
        assert containers_of(rootish["id"]) == []
        stack.request("POST", f"/api/v1/deployments/{refused_id}/evict", {}, a["token"])

        status, op = stack.request(
            "POST", f"/api/v1/deployments/{deployment_id}/place", {"gpu": gpu_id}, a["token"]
        )
        assert status in (200, 201, 202), op
        (replica,) = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]

        def printed() -> list[str] | None:
            status, body = stack.request(
                "GET", f"/api/v1/allocations/{replica['id']}/logs?tail=50", token=a["token"]
            )
            if status == 409 and body["code"] == "logs.agent_unreachable":
                return None  # the socket's marker, refreshed every few seconds, lagged (CI load)
            assert status == 200, body
            lines = [line for line in body["lines"] if not line.startswith("fleet: ")]
            return lines if any(line.startswith("docker-sock=") for line in lines) else None

        lines = wait_until(printed, 60, what="the container's lines")
        assert "uid=1000" in lines, lines
        assert any(line.split() == ["CapEff:", "0000000000000000"] for line in lines), lines
        assert any(line.split() == ["NoNewPrivs:", "1"] for line in lines), lines
        assert "token-read=1" in lines and "docker-sock=1" in lines, lines
        (box,) = containers_of(replica["id"])
        host = box["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], host
        assert host["SecurityOpt"] == ["no-new-privileges"] and not host["Privileged"], host
        assert host["PidsLimit"] and host["PidsLimit"] > 0 and host["Memory"] > 0, host
        assert host["NetworkMode"] != "host" and host["IpcMode"] != "host", host
        mounted = {m.get("Source", "") for m in box["Mounts"]}
        assert not any(str(agent.dir) in source for source in mounted), mounted
        assert box["Config"]["User"] == "1000:1000"
    finally:
        for deployment in (refused_id, deployment_id):
            stack.request("DELETE", f"/api/v1/deployments/{deployment}/", token="admin")
        wait_until(
            lambda: (
                not any(
                    stack.get(f"/api/v1/allocations/?deployment={d}")["results"]
                    for d in (refused_id, deployment_id)
                )
            ),
            30,
            what="the containers stopped",
        )
