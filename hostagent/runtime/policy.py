"""One replica's life as the supervisor keeps it: the record, and the pure rules that move it
on an exit, a failed start or a health check (no threads, no I/O, ``now`` passed in).

The rules, as Kubernetes and Docker users know them:

* **Restart policy**: ``always`` restarts after any exit, ``on-failure`` after a non-zero (or
  unknown) exit, ``never`` leaves the replica ``exited`` with its code.
* **Backoff**: the n-th restart in a row waits ``RESTART_BACKOFF_S[n]`` (the last value
  repeats); a run that lasted ``stable_after_s`` starts the count again.
* **Crashloop**: :data:`CRASHLOOP_FAILURES` failures within :data:`CRASHLOOP_WINDOW_S` make the
  state ``crashloop`` (and one ``crashloop`` event); the replica is still retried, at the
  longest backoff, as Kubernetes' CrashLoopBackOff does.
* **Failed starts** (no image, no such user...) leave the replica ``failed`` with the reason,
  retried with the same backoff unless ``restart`` is ``never``; they are not crashes.
* **Health**: a replica is ``running`` once a check passes (at once without a check); after
  that, ``retries`` failures in a row, outside the first ``start_period_s`` of a run, restart
  it as its policy says. Before its first pass a replica stays ``starting``, however long
  its model takes to load.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hostagent.protocol import (
    CRASHLOOP_FAILURES,
    CRASHLOOP_WINDOW_S,
    DEFAULT_STOP_GRACE_S,
    RESTART_BACKOFF_S,
    RestartPolicy,
    WorkloadState,
)
from hostagent.runtime.base import Exit, ReplicaSpec, Running

PRE_PASS_CHECK_S = 1.0
"""Until its first pass, a replica is checked at least this often (Docker's
``start_interval``): ``running`` is reported within a second of the workload answering."""
PRE_PASS_FIRST_S = 0.05
"""The first checks after a start come sooner: every half of the time since the start, from
this on, up to :data:`PRE_PASS_CHECK_S` (0.05, 0.075, 0.11, ... 1 s: seven checks in the first
second, one a second after). A workload that answers within a few hundred milliseconds is
``running`` within a few dozen more, not up to a second later: a scale-out's lag."""


def pre_pass_delay(since_start_s: float, interval_s: float) -> float:
    """How long until the next check of a replica that has not passed one yet."""
    return min(interval_s, PRE_PASS_CHECK_S, max(PRE_PASS_FIRST_S, since_start_s / 2.0))


@dataclass(frozen=True)
class Timing:
    """The supervisor's clocks; tests scale them down instead of sleeping for minutes."""

    backoff_s: tuple[float, ...] = RESTART_BACKOFF_S
    crashloop_failures: int = CRASHLOOP_FAILURES
    crashloop_window_s: float = CRASHLOOP_WINDOW_S
    stable_after_s: float = CRASHLOOP_WINDOW_S
    poll_s: float = 0.5
    health_scale: float = 1.0
    maintain_every_s: float = 30.0
    # A drain ends early once no connection is open on the replica's ports (no request in
    # flight: the balancers closed their idle ones), looked at this often, from this long after
    # it began (the balancers have had the time to take the copy out of rotation).
    drain_check_s: float = 0.1
    drain_settle_s: float = 0.5

    @classmethod
    def scaled(cls, factor: float, poll_s: float = 0.05) -> Timing:
        """Every wait multiplied by ``factor`` (the counts stay)."""
        return cls(
            backoff_s=tuple(s * factor for s in RESTART_BACKOFF_S),
            crashloop_window_s=CRASHLOOP_WINDOW_S * factor,
            stable_after_s=CRASHLOOP_WINDOW_S * factor,
            poll_s=poll_s,
            health_scale=factor,
        )


StopReason = str
"""Why the supervisor stops a workload: ``removed`` (not wanted any more), ``orphan`` (not
given to this agent), ``replace`` (its spec changed), ``unhealthy``."""


@dataclass
class Replica:
    """One replica as the supervisor keeps it (guarded by the supervisor's lock).

    ``spec`` is ``None`` for a workload found at start that no desired state has claimed yet;
    ``running`` is the live workload, ``ended`` the last one that ended (discarded when the
    replica is forgotten or started again).
    """

    allocation_id: int
    spec: ReplicaSpec | None
    wanted: bool = True
    running: Running | None = None
    ended: Running | None = None
    launched: str = ""
    state: WorkloadState = "pending"
    started_at: float | None = None
    exit_code: int | None = None
    restarts: int = 0
    message: str = ""
    busy: bool = False
    hold: bool = False
    stop_reason: StopReason | None = None
    not_before: float = 0.0
    streak: int = 0
    failures: list[float] = field(default_factory=list)
    crashloop_reported: bool = False
    healthy: bool = False
    check_failures: int = 0
    next_check: float = 0.0
    run_since: float = 0.0
    # While it drains before a stop (its spec's ``drain_s``): when SIGTERM is due at the latest,
    # and when the drain began.
    drain_until: float | None = None
    drain_since: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    reported: tuple[object, ...] = ()

    @property
    def gpu_uuid(self) -> str | None:
        if self.spec is not None:
            return self.spec.gpu_uuid
        live = self.running or self.ended
        return live.gpu_uuid if live else None

    @property
    def drain_s(self) -> int:
        return self.spec.drain_s if self.spec is not None else 0

    @property
    def stop_grace_s(self) -> int:
        if self.spec is not None:
            return self.spec.workload["stop_grace_s"]
        live = self.running or self.ended
        return live.stop_grace_s if live else DEFAULT_STOP_GRACE_S


def should_restart(policy: RestartPolicy, exit_code: int | None) -> bool:
    """``always``: yes; ``on-failure``: unless it exited 0; ``never``: no."""
    if policy == "never":
        return False
    return policy == "always" or exit_code != 0


def backoff(timing: Timing, streak: int, crashloop: bool) -> float:
    """The wait before the next restart."""
    steps = timing.backoff_s
    return steps[-1] if crashloop else steps[min(streak, len(steps) - 1)]


def recent(failures: list[float], now: float, timing: Timing) -> list[float]:
    """The failures within the crashloop window."""
    return [t for t in failures if now - t < timing.crashloop_window_s]


def describe_exit(ended: Exit) -> str:
    """``exited with code 3`` / ``killed by signal 9`` / ``ended (exit code unknown)``."""
    if ended.exit_code is None:
        text = "ended (exit code unknown)"
    elif ended.exit_code < 0:
        text = f"killed by signal {-ended.exit_code}"
    else:
        text = f"exited with code {ended.exit_code}"
    return f"{text}: {ended.message}" if ended.message else text


def on_exit(r: Replica, ended: Exit, now: float, timing: Timing) -> bool:
    """Record an exit of a wanted replica; return whether it just entered crashloop (the
    caller sends the event). The replica is left ``exited`` or waiting for its restart."""
    assert r.spec is not None
    reason, r.stop_reason = r.stop_reason, None
    r.running, r.exit_code, r.healthy = None, ended.exit_code, False
    if reason in ("replace", "removed"):  # the agent's own doing: no failure, no wait
        r.state, r.message, r.not_before = "pending", "starting again", now
        return False
    if now - r.run_since >= timing.stable_after_s:
        r.streak = 0
    unhealthy = reason == "unhealthy"
    if unhealthy or ended.exit_code != 0:
        r.failures = [*recent(r.failures, now, timing), now]
    what = "stopped: its health check kept failing" if unhealthy else describe_exit(ended)
    policy = r.spec.workload["restart"]
    if not (should_restart(policy, ended.exit_code) or (unhealthy and policy != "never")):
        r.state, r.message = "exited", what
        return False
    crashloop = len(recent(r.failures, now, timing)) >= timing.crashloop_failures
    delay = backoff(timing, r.streak, crashloop)
    r.streak += 1
    r.not_before = now + delay
    r.state = "crashloop" if crashloop else "pending"
    r.message = f"{what}; restarting in {delay:.3g} s"
    entered = crashloop and not r.crashloop_reported
    r.crashloop_reported = crashloop
    return entered


def on_start_failure(r: Replica, why: str, now: float, timing: Timing) -> None:
    """A start failed: ``failed`` with the reason, retried later unless ``restart: never``."""
    assert r.spec is not None
    r.state = "failed"
    if r.spec.workload["restart"] == "never":
        r.message = why
        return
    delay = backoff(timing, r.streak, False)
    r.streak += 1
    r.not_before = now + delay
    r.message = f"{why}; trying again in {delay:.3g} s"


def on_started(r: Replica, running: Running, now: float) -> None:
    """The workload runs: ``running`` at once without a health check, else ``starting``."""
    assert r.spec is not None
    r.running, r.started_at, r.run_since = running, running.started_at, now
    r.launched, r.exit_code, r.check_failures = r.spec.fingerprint(), None, 0
    r.healthy = r.spec.workload["health"] is None
    r.next_check = now
    if r.healthy:
        r.state, r.message = "running", ""
    else:
        r.state, r.message = "starting", "waiting for its health check to pass"


def on_check(r: Replica, failure: str | None, now: float, timing: Timing) -> bool:
    """Record a health check result; return whether the replica must be stopped (it passed
    once, then failed ``retries`` times in a row outside its start period)."""
    health = r.spec.workload["health"] if r.spec else None
    if health is None or r.running is None:
        return False
    interval = health["interval_s"] * timing.health_scale
    if failure is None:
        r.check_failures, r.healthy = 0, True
        r.state, r.message = "running", ""
        r.next_check = now + interval
        return False
    r.next_check = now + (interval if r.healthy else pre_pass_delay(now - r.run_since, interval))
    if not r.healthy:
        r.message = f"health check not passed yet: {failure}"
        return False
    if now - r.run_since < health["start_period_s"] * timing.health_scale:
        return False
    r.check_failures += 1
    r.message = f"health check failed {r.check_failures} time(s) in a row: {failure}"
    return r.check_failures >= health["retries"]
