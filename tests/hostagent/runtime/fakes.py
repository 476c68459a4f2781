"""A runtime test double for the supervisor's state machine: workloads are records in memory,
ended by the test (the real runtimes have their own suites against real processes and a real
Docker Engine)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

from hostagent.protocol import Workload, default_health, default_workload
from hostagent.runtime import Exit, Found, ReplicaSpec, Running, StartError
from hostagent.runtime.output import NoOutput, Output


class FakeRuntime:
    name = "process"
    refusal: str | None = None

    def __init__(self) -> None:
        self.live: dict[str, Running] = {}
        self.ended: dict[str, Exit] = {}
        self.starts: list[int] = []
        self.specs: dict[int, ReplicaSpec] = {}
        self.stops: list[tuple[int, float]] = []
        self.fail_start: dict[int, str] = {}
        self.exit_on_start: dict[int, int] = {}
        self.found: list[Found] = []
        self.check_code = 0
        self.stop_delay_s = 0.0
        self.output: dict[int, list[str]] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count(1)

    def start(self, spec: ReplicaSpec) -> Running:
        with self.lock:
            self.starts.append(spec.allocation_id)
            self.specs[spec.allocation_id] = spec
            if spec.allocation_id in self.fail_start:
                raise StartError(self.fail_start[spec.allocation_id])
            running = Running(
                spec.allocation_id,
                "process",
                f"w{next(self._ids)}",
                time.time(),
                None,
                spec.gpu_uuid,
                spec.deployment,
                spec.workload["stop_grace_s"],
            )
            self.live[running.ident] = running
            if spec.allocation_id in self.exit_on_start:
                self.ended[running.ident] = Exit(self.exit_on_start[spec.allocation_id])
            return running

    def stop(self, running: Running, grace_s: float) -> Exit:
        time.sleep(self.stop_delay_s)
        with self.lock:
            self.stops.append((running.allocation_id, grace_s))
            return self.ended.setdefault(running.ident, Exit(-15))

    def observe(self, running: Sequence[Running]) -> dict[str, Exit]:
        with self.lock:
            return {r.ident: self.ended[r.ident] for r in running if r.ident in self.ended}

    def find(self) -> list[Found]:
        return list(self.found)

    def exec_check(self, running, spec, command, timeout_s) -> int:
        return self.check_code

    def discard(self, running: Running) -> None:
        with self.lock:
            self.live.pop(running.ident, None)

    def maintain(self) -> None:
        pass

    def capture(self) -> None:
        pass

    def logs(self, allocation_id: int, tail: int, *, before: int | None = None) -> Output:
        with self.lock:
            lines = self.output.get(allocation_id)
        if lines is None:
            raise NoOutput(f"allocation {allocation_id} has written no output yet")
        return Output(lines[-tail:], len(lines) > tail)

    # -- for tests -----------------------------------------------------------------------

    def exit(self, allocation_id: int, code: int) -> None:
        with self.lock:
            for ident, r in self.live.items():
                if r.allocation_id == allocation_id and ident not in self.ended:
                    self.ended[ident] = Exit(code)

    def running_ids(self) -> list[int]:
        with self.lock:
            return sorted(r.allocation_id for i, r in self.live.items() if i not in self.ended)


CONTAINER_USER = "65534:65534"
"""The test image runs as root; a container runs as nobody unless a test says otherwise."""


def workload(runtime="process", **changes) -> Workload:
    w = default_workload()
    w["runtime"] = runtime
    w["command"] = ["serve"]
    if runtime == "container":
        w["user"] = CONTAINER_USER
    w.update(changes)  # type: ignore[typeddict-item]
    return w


def exec_health(**changes):
    health = default_health()
    health["exec"] = {"command": ["check"]}
    health.update(changes)
    return health


def spec(allocation_id: int, gpu: str = "GPU-1", **changes) -> ReplicaSpec:
    return ReplicaSpec(
        allocation_id=allocation_id,
        key=f"a{allocation_id}",
        gpu_uuid=gpu,
        deployment="qwen-7b",
        replica=allocation_id,
        workload=workload(**changes),
        device_uuid=f"MIG-{allocation_id}",
        environment={"CUDA_VISIBLE_DEVICES": f"MIG-{allocation_id}"},
    )


def wait_for(predicate, timeout_s: float = 5.0, every_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s} s")
