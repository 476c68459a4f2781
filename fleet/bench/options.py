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
    log: Callable[[str], None] = print


def default_servers() -> int:
    """One ASGI process per CPU core, at most 4 (the production topology in the README)."""
    return max(1, min(4, os.cpu_count() or 1))
