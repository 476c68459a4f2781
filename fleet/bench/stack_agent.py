"""A simulated host agent as its own ``fleet-agent`` process, started by a :class:`Stack`:
its GPUs from the catalog, a fault directory to inject faults through, and its workloads
cleaned away when the stack stops."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.bench.processes import wait_until

if TYPE_CHECKING:
    from fleet.bench.stack import Stack

BIN = Path(sys.executable).parent


def remove_containers(host_name: str) -> None:
    """Remove the containers a test agent of ``host_name`` started (when Docker answers)."""
    if shutil.which("docker") is None:
        return
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=fleet.host={host_name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    ids = found.stdout.split() if found.returncode == 0 else []
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)


HOSTNAMES: set[str] = set()
"""The hostnames of the agents this process made (:attr:`Agent.hostname`)."""


def container_ids(
    allocation_id: int, *, running: bool = True, hostname_prefix: str | None = None
) -> list[str]:
    """The containers labelled for ``allocation_id`` by an agent of this process, or by one
    whose hostname starts with ``hostname_prefix`` (another run sharing the Docker daemon has
    its own allocations of the same ids)."""
    listed = subprocess.run(
        ["docker", "ps", "--no-trunc", *([] if running else ["-a"]), "--filter",
         f"label=fleet.allocation={int(allocation_id)}", "--format",
         '{{.ID}} {{.Label "fleet.host"}}'],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    rows = [line.split(" ", 1) for line in listed.splitlines() if line.strip()]
    if hostname_prefix is not None:
        return [row[0] for row in rows if len(row) == 2 and row[1].startswith(hostname_prefix)]
    return [row[0] for row in rows if len(row) == 2 and row[1] in HOSTNAMES]


class Agent:
    """One simulated host: ``products`` are catalog keys, one GPU each."""

    def __init__(self, stack: Stack, name: str, products: list[str]) -> None:
        from fleet.inventory.simulation import simulated_spec
        from fleet.mig import product_by_key

        self.stack, self.name, self.products = stack, name, products
        # The machine's name as the agent reports it, and as its containers' ``fleet.host``
        # label says: unique to this agent, so that two runs sharing a Docker daemon (a CI run
        # beside a developer's, two benchmark stacks) never adopt, stop or remove each other's
        # containers. The host's name in Fleet stays ``name``.
        self.hostname = f"{name}.{uuid.uuid4().hex[:8]}"
        HOSTNAMES.add(self.hostname)
        self.dir = stack.workdir / f"agent-{name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.dir / "token.json"
        self.faults = self.dir / "faults"
        specs = [simulated_spec(product_by_key(k)) for k in products]  # type: ignore[arg-type]
        (self.dir / "gpus.json").write_text(
            json.dumps({"seed": abs(hash(name)) % 10_000, "gpus": specs})
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.host_id = 0  # the host's id, once :meth:`Stack.add_agent` created it
        self.runtime: str | None = None

    def start(
        self,
        enrollment_token: str | None = None,
        hostname: str | None = None,
        transport: str = "ws",
        runtime: str | None = None,
        allow_mutation: bool = True,
    ) -> Agent:
        args = [
            str(BIN / "fleet-agent"),
            "--server", self.stack.url,
            "--token-file", str(self.token_file),
            "--simulate", str(self.dir / "gpus.json"),
            *(["--allow-mutation"] if allow_mutation else []),
            "--interval", "0.5",
            "--hostname", hostname or self.hostname,
            "--fault-dir", str(self.faults),
            "--mps-dir", str(self.dir / "mps"),
        ]  # fmt: skip
        if enrollment_token:
            args += ["--enroll", enrollment_token]
        args += ["--transport", transport]
        if runtime is not None:
            args += ["--runtime", runtime, "--state-dir", str(self.dir / "workloads")]
            # The tests' processes run as the test's user; their images are built locally.
            args += ["--allow-process-runtime", "--process-as-agent-user"]
            args += ["--image-pull", "if-not-present"]
        log = (self.dir / "agent.log").open("ab")
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=self.stack.env
        )
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def remove_workloads(self) -> None:
        """Stop what this agent ran: its workloads outlive it by design (an agent restart must
        not stop them), so a test run would leave them behind."""
        state = self.dir / "workloads" / "processes.json"
        try:
            table = json.loads(state.read_text()).get("processes", {})
        except (OSError, ValueError, AttributeError):
            table = {}
        for entry in table.values() if isinstance(table, dict) else []:
            pid = entry.get("pid") if isinstance(entry, dict) else None
            if isinstance(pid, int) and pid > 1:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        remove_containers(self.hostname)

    def fault(self, **command: Any) -> dict[str, Any]:
        """Inject a fault (or run a command) through the agent's fault directory; returns what
        the agent wrote back once it handled it."""
        name = f"{uuid.uuid4().hex}.json"
        self.faults.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: the agent never reads a half-written file.
        staging = self.faults / f".{name}.tmp"
        staging.write_text(json.dumps(command))
        staging.rename(self.faults / name)
        done = self.faults / name.replace(".json", ".done")
        wait_until(done.exists, 10, what=f"fault {command}")
        return dict(json.loads(done.read_text()))

    def log(self) -> str:
        return (self.dir / "agent.log").read_text(errors="replace")
