"""``manage.py bench_rollout --gpus 100 --json OUT``: how long a fleet-wide MIG layout rollout
takes on the production stack (its own, on loopback) with simulated agents; prints JSON. See
:mod:`fleet.bench.rollout` for what is measured."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from fleet.bench.rollout import RolloutOptions, run_rollout_bench
from fleet.commands.bench import StackBenchCommand


class Command(StackBenchCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--gpus", type=int, default=100)
        parser.add_argument("--gpus-per-host", type=int, default=4)
        parser.add_argument("--replicas", type=int, default=100)
        parser.add_argument("--max-unavailable", type=int, default=10)
        parser.add_argument("--timeout", type=float, default=900.0, help="per rollout (s)")

    def handle(self, *args: Any, **options: Any) -> None:
        gpus, per_host = options["gpus"], options["gpus_per_host"]
        if not 1 <= gpus <= 1000 or not 1 <= per_host <= 8:
            raise CommandError("--gpus must be 1..1000 and --gpus-per-host 1..8")
        if not 0 <= options["replicas"] <= gpus * 4:
            raise CommandError("--replicas must fit in four 1g slices per GPU (0..4 x --gpus)")
        if not 1 <= options["max_unavailable"] <= 64:
            raise CommandError("--max-unavailable must be 1..64")
        self.require_postgres(options)
        result = run_rollout_bench(
            RolloutOptions(
                gpus=gpus,
                gpus_per_host=per_host,
                replicas=options["replicas"],
                max_unavailable=options["max_unavailable"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                timeout_s=options["timeout"],
                log=self.log,
            )
        )
        self.emit(result, options)
