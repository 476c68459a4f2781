"""The supervisor's machinery: its thread, one pass over the replicas, and the operations it
runs on worker threads (start, stop, health check, watch, adoption).

Every operation follows one pattern: decided and marked ``busy`` under the lock, run on a worker
(the slow call, outside the lock), finished under the lock (the policy decides what comes next).
One operation at most is in flight per replica, so a replica is never started twice, and one
replica's failure (its runtime raising, a bug) costs only that replica (review D1).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from hostagent.logs import FailureLog
from hostagent.protocol import (
    AgentRuntime,
    Event,
    EventKind,
    WorkloadRuntime,
    WorkloadStatus,
    clip,
    declared_ports,
)
from hostagent.runtime import procfs
from hostagent.runtime.adoption import adopt_found, unsupported
from hostagent.runtime.base import Exit, ReplicaSpec, Running, Runtime, StartError
from hostagent.runtime.health import run_check
from hostagent.runtime.policy import (
    Replica,
    Timing,
    on_check,
    on_exit,
    on_start_failure,
    on_started,
)
from hostagent.runtime.ports import (
    DEFAULT_PORT_RANGE,
    DEFAULT_PUBLISH_ADDRESS,
    PortAllocator,
    PortRange,
    PortsExhausted,
    bindable,
)
from hostagent.runtime.store import ReplicaStore, Stored
from hostagent.runtime.workers import Workers

logger = logging.getLogger(__name__)

WORKERS = 32
MAX_EVENTS = 100
"""Events kept while no connection takes them (the oldest go first)."""


def open_connections(running: Running, spec: ReplicaSpec) -> int | None:
    """The TCP connections open on the replica's ports, in its own network namespace: its host
    ports (a process, a host-network container, a proxy on the host) and its declared ones (a
    bridged container's side). ``None``: not known (no PID, nothing readable). A port that
    another program of the same namespace also serves counts that program's connections too:
    the drain then runs its full length, as before."""
    ports = {*running.host_ports.values(), *spec.host_ports.values()}
    ports |= {p["port"] for p in declared_ports(spec.workload)}
    if running.pid is None or not ports:
        return None
    return procfs.established(running.pid, ports)


class Reconciler:
    """The state and the machinery of :class:`~hostagent.runtime.supervisor.Supervisor`."""

    def __init__(
        self,
        runtimes: Mapping[WorkloadRuntime, Runtime],
        *,
        agent_runtime: AgentRuntime,
        state_dir: Path | None = None,
        timing: Timing | None = None,
        workers: int = WORKERS,
        clock: Callable[[], float] = time.monotonic,
        ports: PortAllocator | None = None,
        connections: Callable[[Running, ReplicaSpec], int | None] = open_connections,
    ) -> None:
        self.runtimes = dict(runtimes)
        self._connections = connections
        self.ports = ports or PortAllocator(
            PortRange.parse(DEFAULT_PORT_RANGE),
            probe=bindable(DEFAULT_PUBLISH_ADDRESS),
            seed=str(state_dir or id(self)),
        )
        self.agent_runtime = agent_runtime
        self.timing = timing or Timing()
        self._by_name = {r.name: r for r in self.runtimes.values()}
        self._store = ReplicaStore(state_dir)
        self._clock = clock
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._replicas: dict[int, Replica] = {}
        self._final: dict[int, WorkloadStatus] = {}
        self._dirty: set[int] = set()
        self._events: list[Event] = []
        self._listeners: list[Callable[[], None]] = []
        self._adopted: set[str] = set()
        self._adoption_news = False
        self._in_flight: set[str] = set()
        self._authority_gpus: set[str] = set()
        self.authoritative = False
        self._closed = False
        self._next_observe = 0.0
        self._next_maintain = 0.0
        self._workers = Workers(workers)
        self._thread: threading.Thread | None = None
        self._log = FailureLog(logger)

    # -- the supervising thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._closed:
                    return
                try:
                    delay = self._tick(self._clock())
                except Exception as exc:  # a bug of one tick must not end supervision (D1)
                    self._log.failure("supervising workloads", exc, expected=False)
                    delay = self.timing.poll_s
                self._wake.wait(timeout=delay)
            self._notify()

    def _tick(self, now: float) -> float:
        """One pass over every replica (under the lock); return how long to sleep."""
        for name, runtime in self._by_name.items():
            if name not in self._adopted and name not in self._in_flight:
                self._submit(name, functools.partial(self._adopt, runtime))
        if now >= self._next_observe:
            self._next_observe = now + self.timing.poll_s
            self._observe_all()
            for runtime in self._by_name.values():  # stamp new output (runtime.output)
                key = f"capture:{runtime.name}"
                if key not in self._in_flight:
                    self._submit(key, runtime.capture)
        if now >= self._next_maintain:
            self._next_maintain = now + self.timing.maintain_every_s
            for runtime in self._by_name.values():
                self._submit(f"maintain:{runtime.name}", runtime.maintain)
        for r in list(self._replicas.values()):
            try:
                self._step(r, now)
            except Exception as exc:  # one replica's bug costs only that replica (D1)
                self._log.failure(f"supervising allocation {r.allocation_id}", exc, expected=False)
        due = [r.not_before for r in self._replicas.values() if r.running is None]
        due += [r.next_check for r in self._replicas.values() if r.running is not None]
        due += [
            min(r.drain_until, now + self.timing.drain_check_s)
            for r in self._replicas.values()
            if r.drain_until is not None
        ]
        return max(0.01, min([self.timing.poll_s, *(d - now for d in due if d > now)]))

    def _step(self, r: Replica, now: float) -> None:
        if r.busy:
            return
        spec = r.spec
        if spec is None or not r.wanted:
            removing = spec is not None or r.stop_reason == "orphan"
            if removing and r.running is not None:
                self._stop(r, "removed" if spec is not None else "orphan")
            elif removing:
                self._forget(r)
            return
        runtime = self.runtimes.get(spec.workload["runtime"])
        if runtime is None or unsupported(spec, self.agent_runtime, self.runtimes):
            return
        if r.running is not None:
            if r.stop_reason == "unhealthy" or r.launched != spec.fingerprint():
                if r.stop_reason is None:
                    logger.info(
                        "allocation %s is replaced: its %s changed",
                        r.allocation_id,
                        ", ".join(changed_parts(r.launched, spec)) or "launch",
                    )
                self._stop(r, r.stop_reason or "replace")
            elif r.drain_until is not None:
                self._undrain(r)  # wanted again, as it is, while it drained
            elif spec.workload["health"] is not None and now >= r.next_check:
                self._check(r, runtime)
            return
        if (
            r.launched == spec.fingerprint()
            and r.state in ("exited", "failed")
            and (r.state == "exited" or spec.workload["restart"] == "never")
        ):
            return  # ended for good (until its spec changes)
        if r.hold or runtime.name not in self._adopted or spec.device_uuid is None:
            return
        if spec.secrets_missing():  # read back from the store: the values were never written
            return
        if now >= r.not_before and self._ports_given(r, now):
            self._start(r, runtime, r.spec or spec)

    # -- host ports (hostagent.runtime.ports) -----------------------------------------------------

    def _with_ports(self, r: Replica, spec: ReplicaSpec) -> ReplicaSpec:
        """``spec`` with the replica's host ports: a host-network container's declared ones,
        else those it has (the record's, or the running workload's after an adoption without
        a store), else new ones from the range. Raises :class:`PortsExhausted`."""
        if not spec.allocates_ports():
            return replace(spec, host_ports=spec.fixed_ports())
        kept = dict(spec.host_ports)
        if not kept and r.spec is not None:
            kept = dict(r.spec.host_ports)
        if not kept and r.running is not None:
            kept = dict(r.running.host_ports)
        taken = {
            port
            for other in self._replicas.values()
            if other is not r
            for port in _ports_of(other).values()
        }
        kept = {name: port for name, port in kept.items() if port not in taken}
        ports = self.ports.allocate(declared_ports(spec.workload), kept, taken)
        return replace(spec, host_ports=ports)

    def _try_ports(self, r: Replica, spec: ReplicaSpec) -> ReplicaSpec:
        """:meth:`_with_ports`, or ``spec`` as it is when the range is full (the start tries
        again, and says why it cannot)."""
        try:
            return self._with_ports(r, spec)
        except PortsExhausted:
            return spec

    def _ports_given(self, r: Replica, now: float) -> bool:
        """Whether the replica has all its host ports, given now if need be; when the range is
        full it is ``failed`` with the reason and retried with the restart backoff."""
        spec = r.spec
        assert spec is not None
        if not spec.allocates_ports() or len(spec.host_ports) == len(declared_ports(spec.workload)):
            return True
        try:
            r.spec = self._with_ports(r, spec)
        except PortsExhausted as exc:
            on_start_failure(r, clip(str(exc)), now, self.timing)
            self._changed(r)
            return False
        self._save()
        return True

    # -- operations (submitted under the lock, run on a worker, finished under the lock) ---------

    def _submit(self, key: str, call: Callable[[], None]) -> None:
        self._in_flight.add(key)

        def run() -> None:
            try:
                call()
            finally:
                with self._wake:
                    self._in_flight.discard(key)
                    self._wake.notify_all()
                self._notify()

        self._workers.submit(run)

    def _adopt(self, runtime: Runtime) -> None:
        try:
            found = runtime.find()
        except Exception as exc:
            self._log.failure(f"finding the {runtime.name} workloads of this host", exc)
            return
        with self._wake:
            orphans = self._authority_gpus if self.authoritative else None
            for r in adopt_found(self._replicas, found, self._clock(), orphans):
                self._changed(r)
            self._adopted.add(runtime.name)
            self._adoption_news = True

    def _start(self, r: Replica, runtime: Runtime, spec: ReplicaSpec) -> None:
        if r.ended is not None:
            r.restarts += 1
            self._save()
        r.busy, r.launched = True, spec.fingerprint()
        r.state, r.message = "starting", "starting"
        self._changed(r)

        def start() -> None:
            error = None
            try:
                running = runtime.start(spec)
            except StartError as exc:
                error = str(exc)
            except Exception as exc:  # the runtime failed (its daemon is gone): say so, retry
                error = f"{type(exc).__name__}: {exc}"
            with self._wake:
                r.busy = False
                if error is not None:
                    on_start_failure(r, clip(error), self._clock(), self.timing)
                else:
                    r.ended = None
                    on_started(r, running, self._clock())
                self._changed(r)

        self._submit(f"start:{r.allocation_id}", start)

    def _draining(self, r: Replica, reason: str) -> bool:
        """A replica no longer wanted, or replaced, first stays up reported ``stopping`` (its
        balancers take it out of rotation; what it serves finishes): ``drain_s`` at most, and
        no longer than a connection is open on its ports, as a load balancer's target
        deregistration ends once nothing is in flight (the gateway closes its idle connections
        to a copy out of rotation that serves nothing). An unhealthy or orphaned replica is
        stopped at once. Never holds a worker thread."""
        if reason not in ("removed", "replace") or not r.drain_s:
            return False
        now = self._clock()
        if r.drain_until is None:
            r.drain_until, r.drain_since = now + r.drain_s, now
            r.state, r.message = "stopping", f"draining for {r.drain_s} s at most before it stops"
            self._changed(r)
        if now >= r.drain_until:
            return False
        if now - r.drain_since >= self.timing.drain_settle_s and self._idle(r):
            logger.info(
                "allocation %s drained in %.2f s: no connection open on its ports",
                r.allocation_id,
                now - r.drain_since,
            )
            return False
        return True

    def _idle(self, r: Replica) -> bool:
        if r.running is None or r.spec is None:
            return False
        try:
            return self._connections(r.running, r.spec) == 0
        except Exception as exc:  # not known: the drain runs its full length
            self._log.failure(f"counting allocation {r.allocation_id}'s connections", exc)
            return False

    def _undrain(self, r: Replica) -> None:
        r.drain_until = None
        r.state = "running" if r.healthy else "starting"
        r.message = "" if r.healthy else "waiting for its health check to pass"
        self._changed(r)

    def _stop(self, r: Replica, reason: str) -> None:
        running = r.running
        assert running is not None
        runtime = self._by_name.get(running.runtime)
        if runtime is None:
            return
        if self._draining(r, reason):
            return
        r.drain_until = None
        logger.info("stopping allocation %s (%s)", r.allocation_id, reason)
        r.busy, r.stop_reason = True, reason
        r.state, r.message = "stopping", f"stopping ({reason})"
        self._changed(r)
        grace = r.stop_grace_s

        def stop() -> None:
            try:
                ended = runtime.stop(running, grace)
            except Exception as exc:
                self._log.failure(f"stopping allocation {r.allocation_id}", exc)
                with self._wake:
                    r.busy = False  # tried again at the next tick
                return
            with self._wake:
                r.busy = False
                self._ended(r, running, ended)

        self._submit(f"stop:{r.allocation_id}", stop)

    def _check(self, r: Replica, runtime: Runtime) -> None:
        running, spec = r.running, r.spec
        assert running is not None and spec is not None
        r.busy = True

        def check() -> None:
            try:
                failure = run_check(runtime, running, spec)
            except Exception as exc:
                failure = clip(f"{type(exc).__name__}: {exc}")
            with self._wake:
                r.busy = False
                if r.running is running and on_check(r, failure, self._clock(), self.timing):
                    r.stop_reason = "unhealthy"
                self._changed(r)

        self._submit(f"check:{r.allocation_id}", check)

    def _observe_all(self) -> None:
        for name, runtime in self._by_name.items():
            live = [
                r.running
                for r in self._replicas.values()
                if r.running is not None and r.running.runtime == name
            ]
            key = f"observe:{name}"
            if live and key not in self._in_flight:
                self._submit(key, functools.partial(self._observe, runtime, live))

    def _observe(self, runtime: Runtime, handles: list[Running]) -> None:
        try:
            ended = runtime.observe(handles)
        except Exception as exc:
            self._log.failure(f"watching the {runtime.name} workloads", exc)
            return
        with self._wake:
            for r in list(self._replicas.values()):
                running = r.running
                stopping = r.busy and r.state == "stopping"  # the stop reports it
                if running is not None and running.ident in ended and not stopping:
                    self._ended(r, running, ended[running.ident])

    def _ended(self, r: Replica, running: Running, ended: Exit) -> None:
        """A workload ended (by itself or stopped): the policy decides what comes next."""
        if r.running is not running:
            return
        now = self._clock()
        if r.spec is None or not r.wanted:
            r.running, r.ended, r.exit_code = None, running, ended.exit_code
            if r.spec is not None or r.stop_reason == "orphan":
                self._forget(r)
            else:
                r.state, r.message = "exited", "not claimed by a desired state yet"
                self._changed(r)
            return
        r.ended = running
        if on_exit(r, ended, now, self.timing):
            spec = r.spec
            self._event(
                "crashloop",
                spec.gpu_uuid,
                f"{spec.deployment} replica {spec.replica} (allocation {r.allocation_id}): "
                f"{len(r.failures)} failures within {self.timing.crashloop_window_s:g} s; "
                f"last: {r.message}",
            )
        self._changed(r)

    def _forget(self, r: Replica) -> None:
        """Nothing runs for the replica any more: report ``none`` once, then drop it."""
        self._replicas.pop(r.allocation_id, None)
        orphan = r.spec is None
        r.state = "none"
        r.message = "stopped: not given to this agent" if orphan else "stopped"
        if orphan:
            self._event(
                "orphan_stopped",
                r.gpu_uuid or "",
                f"stopped the workload of allocation {r.allocation_id}: no desired state gives "
                "it to this host",
            )
        self._final[r.allocation_id] = status_of(r)
        self._dirty.discard(r.allocation_id)
        ended = r.ended
        if ended is not None and (runtime := self._by_name.get(ended.runtime)) is not None:
            self._submit(f"discard:{ended.ident}", lambda: runtime.discard(ended))
        self._save()
        self._wake.notify_all()

    # -- bookkeeping ----------------------------------------------------------------------------

    def _changed(self, r: Replica) -> None:
        key = (r.state, r.started_at, r.exit_code, r.restarts, r.message, str(_ports_of(r)))
        if key != r.reported and r.allocation_id in self._replicas:
            r.reported = key
            self._dirty.add(r.allocation_id)

    def _event(self, kind: EventKind, gpu: str, detail: str) -> None:
        del self._events[: max(0, len(self._events) - MAX_EVENTS + 1)]
        self._events.append(
            {
                "type": "event",
                "kind": kind,
                "gpu_uuid": gpu[:96],
                "gpu_instance_id": None,
                "xid": None,
                "detail": clip(detail),
                "ts": time.time(),
            }
        )
        logger.warning("%s: %s", kind, detail)

    def _save(self) -> None:
        self._store.save(
            [Stored(r.spec, r.restarts) for r in self._replicas.values() if r.spec and r.wanted]
        )

    @property
    def adopted(self) -> bool:
        """Every runtime has looked for the workloads already on this host: until then a full
        report would omit them, and the control plane would take them for gone."""
        with self._lock:
            return set(self._by_name) <= self._adopted

    def _notify(self) -> None:
        with self._lock:
            due = bool(self._dirty or self._final or self._events or self._adoption_news)
            self._adoption_news = False
        if due:
            for listener in self._listeners:
                listener()


def reportable(r: Replica) -> bool:
    """Whether the replica is reported: one given to this agent, or a workload found here."""
    return r.spec is not None or r.running is not None or r.ended is not None


def status_of(r: Replica) -> WorkloadStatus:
    """The replica as the ``workloads`` message says it (``pids`` filled in by the caller)."""
    code = r.exit_code
    return {
        "allocation_id": r.allocation_id,
        "state": r.state,
        "started_at": r.started_at,
        "exit_code": None if code is None else max(-255, min(255, code)),
        "restarts": min(r.restarts, 2**31 - 1),
        "message": clip(r.message),
        "pids": [],
        "ports": _ports_of(r),
    }


def _ports_of(r: Replica) -> dict[str, int]:
    """The replica's host ports: its spec's, else (adopted, not claimed yet) its workload's."""
    if r.spec is not None and r.spec.host_ports:
        return dict(r.spec.host_ports)
    live = r.running or r.ended
    return dict(live.host_ports) if live is not None else {}


def changed_parts(launched: str, spec: ReplicaSpec) -> list[str]:
    """The names of the fingerprint's parts that differ between ``launched`` (the fingerprint
    a replica was started or adopted with) and ``spec``'s."""
    try:
        before = json.loads(launched) if launched else {}
    except ValueError:
        before = {}
    now = json.loads(spec.fingerprint())
    if not isinstance(before, dict) or not before:
        return sorted(now)
    return sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
