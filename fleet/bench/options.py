"""What one ``bench_live`` run is asked to do (shared by the run and the stack it starts)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Options:
    hosts: int
    gpus_per_host: int = 8
    seconds: float = 30.0
    servers: int = 1
    enrolled: bool = True  # the hosts' GPUs are known: the agents' hellos are reconnects
    browsers: int = 2
    swarms: int = 0  # 0: one agent process per 400 hosts
    product: str = "h100-sxm5-80gb"
    interval_s: float = 1.0
    urls: list[str] = field(default_factory=list)  # connect to a running stack instead
    database_url: str = ""
    warmup_timeout_s: float = 120.0
    channel_capacity: int | None = None
    live_batch_s: float | None = None
    workdir: Path | None = None
    server_pids: list[int] = field(default_factory=list)
    # Restart every ASGI server once, this many seconds into the window (None: no restart).
    restart_at: float | None = None
    replicas: int = -1  # whole-GPU replicas placed before the run (-1: one per 10 hosts)
    goal: str = ""  # "latency", "storm" or "overload" ("": storm with --restart-at, else latency)
    log: Callable[[str], None] = print

    @property
    def chosen_goal(self) -> str:
        return self.goal or ("storm" if self.restart_at is not None else "latency")

    @property
    def replicas_to_place(self) -> int:
        if self.replicas >= 0:
            return self.replicas
        return self.hosts // 10 if self.chosen_goal != "latency" else 0


def default_servers() -> int:
    """One ASGI process per CPU core, at most 4 (the production topology in the README)."""
    return max(1, min(4, os.cpu_count() or 1))
