"""``manage.py bench_endpoints --seconds 120 --json OUT``: the Azure LLM conversation trace's
arrivals, replayed through a Fleet gateway (HAProxy) to a deployment of 4 replicas while they
move, roll out, drain and crash, on the production stack (its own, on loopback); prints JSON.
See :mod:`fleet.bench.endpoints` for what is measured and :mod:`fleet.bench.endpoint_report` for
the goals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from fleet.bench.endpoint_changes import KINDS
from fleet.bench.endpoints import EndpointOptions, run_endpoints_bench
from fleet.bench.replay import TRACE
from fleet.commands.bench import StackBenchCommand


class Command(StackBenchCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--seconds", type=float, default=120.0, help="replay length (s)")
        parser.add_argument(
            "--requests", type=int, default=None, help="the trace's first N requests (all)"
        )
        parser.add_argument("--replicas", type=int, default=4)
        parser.add_argument("--hosts", type=int, default=3)
        parser.add_argument(
            "--changes",
            default=",".join(KINDS),
            help=f"which changes, in this order (comma-separated: {', '.join(KINDS)})",
        )
        parser.add_argument(
            "--agent-down", type=float, default=5.0, help="seconds the killed agent stays down"
        )
        parser.add_argument("--trace", type=Path, default=TRACE, help="the Azure trace's CSV")
        parser.add_argument("--timeout", type=float, default=120.0, help="per change (s)")
        parser.add_argument(
            "--runtime",
            choices=("process", "docker"),
            default="process",
            help="the copies as processes, or as containers on the local Docker Engine",
        )
        parser.add_argument(
            "--require-goal", action="store_true", help="exit 1 when a goal is missed"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        changes = tuple(c for c in str(options["changes"]).split(",") if c)
        unknown = sorted(set(changes) - set(KINDS))
        if unknown:
            raise CommandError(f"--changes: unknown {unknown[0]!r} (known: {', '.join(KINDS)})")
        if not 5 <= options["seconds"] <= 3600:
            raise CommandError("--seconds must be 5..3600")
        if options["requests"] is not None and options["requests"] < 10:
            raise CommandError("--requests must be at least 10")
        if not 2 <= options["replicas"] <= 16 or not 2 <= options["hosts"] <= 16:
            raise CommandError("--replicas and --hosts must be 2..16")
        if options["replicas"] + 1 > options["hosts"] * 4 - 4:
            raise CommandError("--hosts x 4 GPUs must hold the replicas, a surge and a drain")
        if not options["trace"].is_file():
            raise CommandError(f"--trace: {options['trace']} is not a file")
        if shutil.which("haproxy") is None:
            raise CommandError("bench_endpoints needs HAProxy: apt-get install haproxy")
        if options["runtime"] == "docker" and shutil.which("docker") is None:
            raise CommandError("--runtime docker needs Docker: apt-get install docker.io")
        self.require_postgres(options)
        result = run_endpoints_bench(
            EndpointOptions(
                seconds=options["seconds"],
                requests=options["requests"],
                replicas=options["replicas"],
                hosts=options["hosts"],
                changes=changes,
                agent_down_s=options["agent_down"],
                lead_in_s=min(5.0, options["seconds"] * 0.05),
                trace=options["trace"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                timeout_s=options["timeout"],
                runtime=options["runtime"],
                log=self.log,
            )
        )
        self.emit(result, options)
        if options["require_goal"] and not result["goal_met"]:
            missed = [name for name, ok in result["goals"].items() if not ok]
            raise CommandError(f"goal missed: {'; '.join(missed)}")
