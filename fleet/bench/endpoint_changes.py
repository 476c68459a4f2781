"""The changes ``bench_endpoints`` makes while the trace replays through the gateway, each with
its time window: moves, a rolling update, a host drain, a SIGKILLed agent, a SIGKILLed replica.

Every change waits for its end (the operation's success, or the deployment back to its ready
count) before the next starts, so their windows do not overlap and a failed request is blamed on
the one change it overlapped.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet.bench.api import Api
from fleet.bench.processes import wait_until
from fleet.bench.stack_agent import container_ids

KINDS = ("move", "rollout", "drain", "kill-agent", "kill-replica")
# The changes whose failed requests are the goal's "0 failed during changes".
GRACEFUL = ("move", "rollout", "drain")


@dataclass
class Change:
    kind: str
    started: float  # monotonic
    ended: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    ok: bool = False

    def report(self, origin: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start_s": round(self.started - origin, 2),
            "end_s": round(self.ended - origin, 2),
            "ok": self.ok,
            **self.detail,
        }


@dataclass
class Scenario:
    """What the changes act on: the API, the deployment, and the agents (one process per host,
    ``kill_agent`` and ``start_agent`` by host id)."""

    api: Api
    deployment: int
    replicas: int
    kill_agent: Callable[[int], None]
    start_agent: Callable[[int], None]
    agent_down_s: float = 5.0
    timeout_s: float = 120.0
    log: Callable[[str], None] = print
    changes: list[Change] = field(default_factory=list)
    kill_copy: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """SIGKILLs a copy's process and says what it killed (default: the token server's process,
    found by its ``X-Replica`` header; the Docker mode kills the copy's container instead)."""

    # -- reads --------------------------------------------------------------------------

    def copies(self) -> list[dict[str, Any]]:
        return self.api.allocations(self.deployment)

    def ready(self) -> list[dict[str, Any]]:
        return [a for a in self.copies() if a["ready"] and a["state"] != "releasing"]

    def settled(self) -> bool:
        copies = self.copies()
        return len(copies) == self.replicas and all(a["ready"] for a in copies)

    def host_of(self) -> dict[int, int]:
        gpus = self.api.ok("GET", "/api/v1/gpus/?limit=1000")["results"]
        return {int(g["id"]): int(g["host"]) for g in gpus}

    def free_gpu(self, avoid_host: int | None) -> int:
        """A GPU no replica uses, on a ready host that is not draining (another host than
        ``avoid_host`` when one has room)."""
        hosts = self.api.ok("GET", "/api/v1/hosts/?limit=1000")["results"]
        usable = {int(h["id"]) for h in hosts if h["status"] == "ready" and not h.get("drain")}
        used = {
            int(a["gpu"])
            for a in self.api.ok("GET", "/api/v1/allocations/?limit=1000")["results"]
            if a.get("gpu") is not None
        }
        hosts_of = self.host_of()
        free = [g for g, h in sorted(hosts_of.items()) if h in usable and g not in used]
        if not free:
            raise RuntimeError("no free GPU to move a replica to")
        return next((g for g in free if hosts_of[g] != avoid_host), free[0])

    def wait_operation(self, op: dict[str, Any]) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            now = self.api.ok("GET", f"/api/v1/operations/{op['id']}/")
            return now if now["status"] in ("succeeded", "failed", "cancelled", "expired") else None

        final: dict[str, Any] = wait_until(done, self.timeout_s, f"operation {op['id']}")
        return final

    # -- changes ------------------------------------------------------------------------

    def run(self, kinds: list[str]) -> None:
        for kind in kinds:
            change = Change(kind, time.monotonic())
            self.changes.append(change)
            try:
                getattr(self, "_" + kind.replace("-", "_"))(change)
                wait_until(self.settled, self.timeout_s, f"{self.replicas} copies ready")
                change.ok = change.detail.get("status", "succeeded") == "succeeded"
            except (AssertionError, RuntimeError, OSError) as exc:
                change.detail["error"] = f"{type(exc).__name__}: {exc}"[:300]
            change.ended = time.monotonic()
            self.log(f"{kind}: {change.ended - change.started:.1f} s, ok={change.ok}")

    def _move(self, change: Change) -> None:
        hosts = self.host_of()
        statuses = []
        for copy in sorted(self.copies(), key=lambda a: int(a["id"])):
            target = self.free_gpu(avoid_host=hosts.get(int(copy["gpu"])))
            op = self.api.ok("POST", f"/api/v1/allocations/{copy['id']}/move", {"gpu": target})
            statuses.append(self.wait_operation(op)["status"])
            wait_until(self.settled, self.timeout_s, "the moved copy ready")
        change.detail["moves"] = len(statuses)
        change.detail["status"] = (
            "succeeded" if all(s == "succeeded" for s in statuses) else "failed"
        )

    def _rollout(self, change: Change) -> None:
        deployment = self.api.ok("GET", f"/api/v1/deployments/{self.deployment}/")
        workload = dict(deployment["workload"])
        env = dict(workload.get("env") or {})
        env["VERSION"] = str(int(env.get("VERSION", "1")) + 1)
        workload["env"] = env
        body = {
            "workload": workload,
            "rollout": {"max_surge": 1, "max_unavailable": 0, "min_ready_s": 1},
        }
        op = self.api.ok("PATCH", f"/api/v1/deployments/{self.deployment}/", body)
        change.detail["status"] = self.wait_operation(op)["status"]
        change.detail["version"] = env["VERSION"]

    def _drain(self, change: Change) -> None:
        hosts = self.host_of()
        counts: dict[int, int] = {}
        for copy in self.copies():
            counts[hosts[int(copy["gpu"])]] = counts.get(hosts[int(copy["gpu"])], 0) + 1
        host = max(counts, key=lambda h: (counts[h], -h))
        op = self.api.ok("POST", f"/api/v1/hosts/{host}/drain", {})
        change.detail.update(host=host, replicas_on_it=counts[host])
        change.detail["status"] = self.wait_operation(op)["status"]

    def _kill_agent(self, change: Change) -> None:
        hosts = self.host_of()
        drained = {
            int(h["id"])
            for h in self.api.ok("GET", "/api/v1/hosts/?limit=1000")["results"]
            if h.get("drain") or h["status"] != "ready"
        }
        with_copies = sorted({hosts[int(a["gpu"])] for a in self.copies()} - drained)
        if not with_copies:
            raise RuntimeError("no ready host runs a replica")
        host = with_copies[0]
        self.kill_agent(host)
        change.detail.update(host=host, down_s=self.agent_down_s)
        time.sleep(self.agent_down_s)
        self.start_agent(host)
        wait_until(
            lambda: self.api.ok("GET", f"/api/v1/hosts/{host}/")["status"] == "ready",
            self.timeout_s,
            "the agent back",
        )

    def _kill_replica(self, change: Change) -> None:
        copy = sorted(self.ready(), key=lambda a: int(a["id"]))[0]
        killed_at = time.monotonic()
        killed = (self.kill_copy or kill_process)(copy)
        change.detail.update(allocation=int(copy["id"]), killed_at=killed_at, **killed)
        # Its agent restarts it (restart: always), or Fleet replaces it; the change ends when
        # Fleet has seen it go and the deployment is whole again.
        wait_until(lambda: self._restarted(copy), self.timeout_s, "the killed copy restarted")

    def _restarted(self, copy: dict[str, Any]) -> bool:
        now = {int(a["id"]): a for a in self.copies()}.get(int(copy["id"]))
        return now is None or int(now["restarts"]) > int(copy["restarts"])


def kill_process(copy: dict[str, Any]) -> dict[str, Any]:
    """SIGKILL the token server serving ``copy`` (a process-runtime copy)."""
    pid = replica_pid(str(copy["address"]))
    os.kill(pid, signal.SIGKILL)
    return {"pid": pid}


def kill_container(copy: dict[str, Any], hostname_prefix: str) -> dict[str, Any]:
    """SIGKILL the main process of ``copy``'s container (a Docker-runtime copy), found by the
    labels its agent gave it (its allocation, and a host of this run: ``hostname_prefix``)."""
    found = container_ids(int(copy["id"]), hostname_prefix=hostname_prefix)
    if len(found) != 1:
        raise RuntimeError(f"copy {copy['id']}: {len(found)} running containers, not 1")
    kill = ["docker", "kill", "--signal", "KILL", found[0]]
    subprocess.run(kill, capture_output=True, check=True, timeout=30)
    return {"container": found[0][:12]}


def replica_pid(address: str) -> int:
    """The process id of the token server at ``host:port`` (its ``X-Replica`` header)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("GET", "/health")
        answer = connection.getresponse()
        answer.read()
        return int(str(answer.getheader("X-Replica", "")).rsplit(":", 1)[-1])
    finally:
        connection.close()
