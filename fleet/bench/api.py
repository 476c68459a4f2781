"""The benches' REST client: JSON in and out with an API token, and the policy that lets the bench's
team run what the benches run."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Token {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    def allow_workloads(self, team: str = "default", host_network: bool = True) -> None:
        """The bench's team may run what the benches run (processes and containers, as the
        bench's own non-root user, or ``nobody`` when it runs as root), as an admin's policy
        would allow: the restricted default refuses processes. ``host_network=False`` gives the
        team's containers a network of their own, each copy's port published on a host port of
        its own (two copies on one host then never claim one port)."""
        found = self.ok("GET", "/api/v1/teams/?limit=1000")["results"]
        team_id = next(t["id"] for t in found if t["slug"] == team)
        uid, gid = os.getuid(), os.getgid()
        user = f"{uid}:{gid}" if uid != 0 else "65534:65534"
        self.ok(
            "PUT",
            f"/api/v1/teams/{team_id}/policy",
            {
                "runtimes": ["container", "process"],
                "process_user": user,
                "uids": [[1, 2_147_483_647]],
                "host_network": host_network,
            },
        )

    def allocations(self, deployment_id: int) -> list[dict[str, Any]]:
        return list(
            self.ok("GET", f"/api/v1/allocations/?deployment={deployment_id}&limit=1000")["results"]
        )
