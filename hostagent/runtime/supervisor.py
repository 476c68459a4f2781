"""The supervisor: makes the workloads that run match the replicas this agent was given, in a
thread of its own, and says what each replica is doing.

It is told per GPU which replicas must run (:meth:`Supervisor.place`, after the GPU's
partitions were made) and which must go (:meth:`Supervisor.release`, before they are
destroyed), and reconciles idempotently: it starts what should run and does not, stops what
should not, never runs a replica twice (one record per allocation, one operation in flight per
record), restarts per policy (:mod:`hostagent.runtime.policy`) and runs the health checks. Slow
calls (pulls, stops with their grace period, checks) run on worker threads: they never hold the
agent's socket, its telemetry or an ack.

**Unreachable is not failed.** At start it adopts what this host already runs (each runtime's
:meth:`~hostagent.runtime.base.Runtime.find`), with the specs it last saved
(:mod:`hostagent.runtime.store`). A workload it was never given is left running until a desired
state from the control plane says it is not wanted (:meth:`Supervisor.authorize`): only then is it
stopped, with an ``orphan_stopped`` event. Losing the connection stops nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from hostagent.protocol import (
    MAX_ITEMS,
    MAX_PROCESSES,
    Event,
    WorkloadReport,
    WorkloadStatus,
    declared_ports,
)
from hostagent.runtime import procfs
from hostagent.runtime.adoption import unsupported
from hostagent.runtime.base import ReplicaSpec, Runtime
from hostagent.runtime.health import check_target
from hostagent.runtime.metrics import ScrapeTarget
from hostagent.runtime.operations import Reconciler, reportable, status_of
from hostagent.runtime.output import RING_LINES, NoOutput, Output, mask_secrets, search
from hostagent.runtime.policy import Replica

SEARCH_LINES = RING_LINES
"""Lines a search reads (a ring's worth): the newest matches among them are answered."""


class Supervisor(Reconciler):
    """Runs the replicas of one agent on its runtimes (``{"container": …, "process": …}``).

    Thread-safe: the apply thread, the agent's loop and the worker threads call it.
    """

    # -- life ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the saved replicas and start the supervising thread (none when this agent runs
        no workloads). Adoption happens in that thread: starting never blocks."""
        with self._lock:
            for stored in self._store.load().values():
                r = Replica(stored.spec.allocation_id, stored.spec, restarts=stored.restarts)
                r.hold, r.message = True, "waiting for the control plane's desired state"
                self._replicas[r.allocation_id] = r
                self._changed(r)
        if self.runtimes and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fleet-supervisor", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop supervising. The workloads keep running: the next agent adopts them."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._workers.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` is called (from any thread) when a report or an event is due."""
        self._listeners.append(listener)

    # -- what the apply says ---------------------------------------------------------------------

    def release(self, gpu: str, keep: Iterable[int]) -> list[int]:
        """Stop every replica on ``gpu`` not in ``keep`` (a desired state no longer lists it);
        return those still running, for :meth:`wait_stopped`."""
        kept = set(keep)
        with self._wake:
            self._authority_gpus.add(gpu)
            live = []
            for r in self._replicas.values():
                if r.gpu_uuid != gpu or r.allocation_id in kept:
                    continue
                if r.spec is None:
                    r.stop_reason = "orphan"
                else:
                    r.wanted = False
                if r.running is not None or r.busy:
                    live.append(r.allocation_id)
            self._wake.notify_all()
        return live

    def place(self, gpu: str, specs: Iterable[ReplicaSpec]) -> None:
        """The replicas that must run on ``gpu`` (the others there stop)."""
        specs = list(specs)
        self.release(gpu, (s.allocation_id for s in specs))
        with self._wake:
            for spec in specs:
                r = self._replicas.get(spec.allocation_id)
                if r is None:
                    r = self._replicas[spec.allocation_id] = Replica(spec.allocation_id, None)
                spec = self._try_ports(r, spec)
                if r.spec is None:  # adopted, now claimed: it runs what it was started with
                    r.launched = spec.fingerprint() if r.running is not None else ""
                    r.stop_reason = None
                elif (
                    r.running is not None
                    and r.launched == r.spec.fingerprint()
                    and renumbered(r.spec, spec)
                ):
                    # Only its index changed: a scale-in renumbers the replicas that stay. It
                    # is the same workload; a restart would take a serving replica out of
                    # rotation for nothing (its FLEET_REPLICA stays the one it started with,
                    # its status and logs follow the new index).
                    r.launched = spec.fingerprint()
                r.spec, r.wanted, r.hold = spec, True, False
                why = unsupported(spec, self.agent_runtime, self.runtimes)
                if why is not None:
                    r.state, r.message = "failed", why
                elif r.running is None and not r.busy and r.state != "failed":
                    r.state = "pending"
                    r.message = "" if spec.device_uuid else "waiting for its partition"
                self._changed(r)
            self._save()
            self._wake.notify_all()
        self._notify()

    def authorize(self, gpus: Iterable[str]) -> None:
        """A desired state from the control plane was applied: what it did not claim on its
        GPUs (or on no known GPU) is an orphan and stops; held replicas may start."""
        with self._wake:
            self.authoritative = True
            self._authority_gpus.update(gpus)
            for r in self._replicas.values():
                r.hold = False
                if r.spec is None and r.gpu_uuid in (*self._authority_gpus, None):
                    r.stop_reason = "orphan"
            self._wake.notify_all()

    def wait_stopped(self, ids: Iterable[int], timeout_s: float) -> bool:
        """Wait until none of ``ids`` runs any more; False if some still do at the timeout."""
        wanted = set(ids)

        def stopped() -> bool:
            return all(
                (r := self._replicas.get(i)) is None or (r.running is None and not r.busy)
                for i in wanted
            )

        with self._wake:
            return self._wake.wait_for(stopped, timeout=timeout_s)

    def stop_everything(self, timeout_s: float) -> bool:
        """Stop every workload this supervisor runs (the demo's agents do, on exit: a real agent
        never does, its workloads outlive it); False if some still run at the timeout."""
        with self._lock:
            gpus = {r.gpu_uuid for r in self._replicas.values() if r.gpu_uuid is not None}
        live = [i for gpu in gpus for i in self.release(gpu, keep=())]
        return self.wait_stopped(live, timeout_s)

    def stop_grace_s(self, ids: Iterable[int]) -> float:
        """The longest drain and stop grace period among ``ids``."""
        with self._lock:
            return max(
                (r.drain_s + r.stop_grace_s for i in ids if (r := self._replicas.get(i))),
                default=0,
            )

    # -- what the agent reports --------------------------------------------------------------------

    def take_report(self, full: bool, once_adopted: bool = False) -> WorkloadReport | None:
        """Every replica (``full``), or those that changed since the last report (``None`` when
        none did). With ``once_adopted``, a full report only if every runtime has found what
        already runs here, else the changes: decided under the lock that adoption holds, so the
        replicas it finds are never first told as changes."""
        with self._lock:
            full = full and (self.adopted or not once_adopted)
            if full:
                records = [r for r in self._replicas.values() if reportable(r)]
                finals: list[WorkloadStatus] = []
            else:
                records = [self._replicas[i] for i in self._dirty if i in self._replicas]
                finals = list(self._final.values())
            self._dirty.clear()
            self._final.clear()
            statuses = [status_of(r) for r in records if reportable(r)] + finals
            leaders = self._leaders()
        if not statuses and not full:
            return None
        if any(s["state"] in ("starting", "running", "stopping") for s in statuses):
            members = procfs.members(leaders)
            for s in statuses:
                s["pids"] = members.get(s["allocation_id"], [])[:MAX_PROCESSES]
        statuses.sort(key=lambda s: s["allocation_id"])
        return {
            "type": "workloads",
            "ts": time.time(),
            "full": full,
            "workloads": statuses[:MAX_ITEMS],
        }

    def take_events(self) -> list[Event]:
        """The ``crashloop`` and ``orphan_stopped`` events since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def owners(self, pids: Iterable[int]) -> dict[int, int]:
        """The replica (allocation ID) of each of ``pids`` that belongs to one."""
        with self._lock:
            leaders = self._leaders()
        if not leaders.sessions and not leaders.containers:
            return {}
        return procfs.owners(pids, leaders)

    def logs(
        self, allocation_id: int, tail: int, *, before: int | None = None, q: str | None = None
    ) -> Output:
        """The newest ``tail`` lines of a replica's output (older than cursor ``before``,
        containing ``q`` where given), from the runtime that runs (or ran) it, its secrets'
        values masked (and searched masked: :func:`~hostagent.runtime.output.search`). Blocks
        on the runtime (a file read, a Docker request): call from a worker thread.

        Raises:
            NoOutput: the replica is not on this host, runs nothing, or has no output (why).
        """
        with self._lock:
            r = self._replicas.get(allocation_id)
            runtime = None if r is None else self._runtime_of(r)
            secrets = r.spec.secret_values() if r is not None and r.spec is not None else []
        if r is None:
            raise NoOutput(f"allocation {allocation_id} is not on this host")
        if runtime is None:
            raise NoOutput(f"allocation {allocation_id} runs no workload on this host")
        if not q:
            return mask_secrets(runtime.logs(allocation_id, tail, before=before), secrets)
        wide = runtime.logs(allocation_id, SEARCH_LINES, before=before)
        return search(mask_secrets(wide, secrets), q, tail)

    def scrape_targets(self) -> list[ScrapeTarget]:
        """The running replicas whose metrics the control plane asked for, and where to read
        them: where their health check would go (:func:`check_target`)."""
        targets: list[ScrapeTarget] = []
        with self._lock:
            for r in self._replicas.values():
                spec, running = r.spec, r.running
                if spec is None or spec.scrape is None or running is None or r.state != "running":
                    continue
                scrape = spec.scrape
                names = tuple(scrape["names"])
                port = next(
                    (
                        p["port"]
                        for p in declared_ports(spec.workload)
                        if p["name"] == scrape["port"]
                    ),
                    None,
                )
                where = (
                    check_target(running, spec, port)
                    if port is not None
                    else f"the workload declares no port named {scrape['port']!r}"
                )
                if isinstance(where, str):
                    targets.append(
                        ScrapeTarget(r.allocation_id, names, scrape["path"], None, where)
                    )
                else:
                    targets.append(ScrapeTarget(r.allocation_id, names, scrape["path"], where))
        return targets

    def _runtime_of(self, r: Replica) -> Runtime | None:
        if r.spec is not None:
            return self.runtimes.get(r.spec.workload["runtime"])
        live = r.running or r.ended
        return self._by_name.get(live.runtime) if live is not None else None

    def states(self) -> dict[int, str]:
        """Allocation ID → state (for tests and the benchmark)."""
        with self._lock:
            return {i: r.state for i, r in self._replicas.items()}

    def _leaders(self) -> procfs.Leaders:
        sessions: dict[int, int] = {}
        containers: dict[int, int] = {}
        for r in self._replicas.values():
            if r.running is not None and r.running.pid:
                target = sessions if r.running.runtime == "process" else containers
                target[r.running.pid] = r.allocation_id
        return procfs.Leaders(sessions, containers)


def renumbered(before: ReplicaSpec, after: ReplicaSpec) -> bool:
    """Whether ``after`` is ``before`` with another replica index, and nothing else changed."""
    if before.replica == after.replica:
        return False
    environment = dict(after.environment)
    if "FLEET_REPLICA" in before.environment:
        environment["FLEET_REPLICA"] = before.environment["FLEET_REPLICA"]
    same = replace(after, replica=before.replica, key=before.key, environment=environment)
    return same.fingerprint() == before.fingerprint()
