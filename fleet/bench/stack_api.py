"""What a :class:`~fleet.bench.stack.Stack`'s user asks of the running product: its REST API with
an operator's or an admin's token, users, sessions, simulated agents, and the waits the tests
and benchmarks share (an operation ending, a GPU converging)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from fleet.bench.processes import wait_until
from fleet.bench.stack_agent import Agent

TERMINAL = ("succeeded", "failed", "expired")


class StackApi(ABC):
    """The REST client half of the stack (mixed into :class:`~fleet.bench.stack.Stack`)."""

    workdir: Path
    urls: list[str]
    agents: list[Agent]
    operator_token: str | None
    admin_token: str | None
    workload_policy: dict[str, Any] | None

    @abstractmethod
    def manage(self, *args: str, timeout: float = 120) -> str:
        """``manage.py ARGS`` against the running stack's settings (:class:`Stack` runs it)."""

    # -- tokens and users ---------------------------------------------------------------

    def token(self, name: str | None) -> str | None:
        """``"operator"`` or ``"admin"`` (made once, on first use), else ``name`` itself (a
        token of its own, a team member's say)."""
        if name in ("operator", "admin"):
            attribute = f"{name}_token"
            if getattr(self, attribute) is None:
                made = self.manage("create_api_token", f"stack-{name}", "--role", name)
                setattr(self, attribute, made.strip())
            return str(getattr(self, attribute))
        return name

    def team_user(self, username: str) -> tuple[int, str]:
        """A user with no fleet role (only a team's role, once an admin gives one): its id and
        an API token."""
        made = self.manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model; "
            f"print(get_user_model().objects.create_user({username!r}).pk)",
        )
        user_id = int(made.strip().splitlines()[-1])
        return user_id, self.manage("create_api_token", username).strip()

    def browser_session(self, base: str, username: str = "watcher", role: str = "viewer") -> str:
        """Log a user in through the login page of ``base``; returns the Cookie header value."""
        import http.cookiejar
        import re

        password = "e2e-" + uuid.uuid4().hex
        self.manage(
            "shell",
            "-c",
            "from fleet.core.services import user_create; from fleet.core.roles import Role; "
            f"user_create(username={username!r}, password={password!r}, role=Role.{role.upper()})",
        )
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(base + "/login/", timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, "no CSRF token on the login page"
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)}
        )
        opener.open(
            urllib.request.Request(
                base + "/login/", data=form.encode(), headers={"Referer": base + "/login/"}
            ),
            timeout=10,
        )
        cookies = {c.name: c.value for c in jar}
        assert "sessionid" in cookies, "login failed"
        return "; ".join(f"{k}={v}" for k, v in cookies.items())

    def allow_workloads(self, policy: dict[str, Any] | None = None, team: str = "default") -> None:
        """Give ``team`` (made if missing) the runtime ``policy`` (default: the stack's
        ``workload_policy``), as an admin would."""
        policy = policy if policy is not None else self.workload_policy
        assert policy is not None, "no workload policy given"
        status, teams = self.request("GET", "/api/v1/teams/?limit=1000", token="admin")
        assert status == 200, teams
        found = next((t for t in teams["results"] if t["slug"] == team), None)
        if found is None:
            status, found = self.request("POST", "/api/v1/teams/", {"name": team}, token="admin")
            assert status == 201, found
        status, answer = self.request(
            "PUT", f"/api/v1/teams/{found['id']}/policy", policy, token="admin"
        )
        assert status == 200, answer

    # -- the REST API -------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = "operator",
        base: str | None = None,
        timeout: float = 15,
    ) -> tuple[int, Any]:
        """One API call: its status and decoded JSON body (``token=None``: anonymous)."""
        headers = {"Content-Type": "application/json"}
        secret = self.token(token) if token else None
        if secret:
            headers["Authorization"] = f"Token {secret}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            (base or self.urls[0]) + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw else None

    def api(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        """:meth:`request` with the token first, as automation holds one."""
        return self.request(method, path, body, token=token, timeout=10)

    def get(self, path: str, token: str | None = "operator", base: str | None = None) -> Any:
        status, body = self.request("GET", path, token=token, base=base)
        assert status == 200, (path, status, body)
        return body

    def raw(self, method: str, path: str, token: str = "operator") -> bytes:
        """The answer's bytes (a CSV export, say)."""
        req = urllib.request.Request(
            self.urls[0] + path,
            method=method,
            headers={"Authorization": f"Token {self.token(token)}"},
        )
        with urllib.request.urlopen(req, timeout=15) as response:
            return bytes(response.read())

    def operation(self, op_id: int) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/operations/{op_id}/"))

    def wait_operation(self, op_id: int, timeout: float = 30) -> dict[str, Any]:
        """The operation once it ended (succeeded, failed or expired); a timeout names the
        state it was last seen in."""
        seen: dict[str, Any] = {}

        def ended() -> dict[str, Any] | None:
            seen.update(self.operation(op_id))
            return dict(seen) if seen["status"] in TERMINAL else None

        try:
            return dict(wait_until(ended, timeout, what=f"operation {op_id}"))
        except AssertionError as error:
            raise AssertionError(f"{error}; it was last seen as {seen}") from None

    # -- agents and GPUs ----------------------------------------------------------------

    def add_agent(
        self, name: str, products: list[str], transport: str = "ws", runtime: str | None = None
    ) -> Agent:
        """A host made through the API and its simulated agent enrolled, once its GPUs show."""
        status, host = self.request("POST", "/api/v1/hosts/", {"name": name}, token="admin")
        assert status == 201, host
        agent = Agent(self, name, products).start(  # type: ignore[arg-type]
            enrollment_token=host["enrollment_token"], transport=transport, runtime=runtime
        )
        agent.runtime = runtime
        agent.host_id = int(host["id"])
        self.agents.append(agent)
        wait_until(
            lambda: self.get(f"/api/v1/gpus/?host={host['id']}")["count"] == len(products),
            30,
            what=f"{name}'s GPUs",
        )
        return agent

    def gpus(self, agent: Agent) -> list[dict[str, Any]]:
        found = self.get(f"/api/v1/gpus/?host={agent.host_id}")["results"]
        return sorted(found, key=lambda g: g["index"])

    def converged(self, gpu_id: int) -> bool:
        """The GPU as its agent observes it equals its desired layout."""
        gpu = self.get(f"/api/v1/gpus/{gpu_id}/")
        partitions = self.get(f"/api/v1/partitions/?gpu={gpu_id}")["results"]
        desired = sorted((p["profile_id"], p["start"]) for p in partitions if p["kind"] == "mig")
        observed = gpu["observed"]
        seen = sorted((i["profile_id"], i["start"]) for i in observed.get("mig_instances", []))
        mig_ok = (
            bool(observed.get("mig_mode_current")) == (gpu["mode"] == "mig")
            if gpu["mig_capable"]
            else True
        )
        mps_wanted = any(p["mps_enabled"] for p in partitions)
        mps_ok = (
            bool(observed.get("mps", {}).get("running")) == mps_wanted
            if gpu["mode"] != "mig"
            else True
        )
        return desired == seen and mig_ok and mps_ok
