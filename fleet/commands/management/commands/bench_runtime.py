"""``manage.py bench_runtime --replicas N --json OUT``: how fast one agent runs, starts, stops
and adopts workloads on the production stack (its own, on loopback), with the Docker runtime and
a locally built image; prints JSON. See :mod:`fleet.bench.runtime` for what is measured."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from fleet.bench.runtime.options import RuntimeOptions
from fleet.bench.runtime.run import run_runtime_bench
from fleet.commands.bench import StackBenchCommand


class Command(StackBenchCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--replicas", type=int, default=20)
        parser.add_argument("--runtime", choices=["docker", "process"], default="docker")
        parser.add_argument("--image", default="fleet-test/busybox:2", help="a local image")
        parser.add_argument("--timeout", type=float, default=120.0, help="per step (s)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["replicas"] <= 700:
            raise CommandError("--replicas must be between 1 and 700")
        self.require_postgres(options)
        result = run_runtime_bench(
            RuntimeOptions(
                replicas=options["replicas"],
                runtime=options["runtime"],
                image=options["image"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                timeout_s=options["timeout"],
                log=self.log,
            )
        )
        self.emit(result, options)
