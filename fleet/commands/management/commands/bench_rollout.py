"""``manage.py bench_rollout --gpus 100 --json OUT``: how long a fleet-wide MIG layout rollout
takes on the production stack (its own, on loopback) with simulated agents; prints JSON. See
:mod:`fleet.bench.rollout` for what is measured."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.bench.rollout import RolloutOptions, run_rollout_bench


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--gpus", type=int, default=100)
        parser.add_argument("--gpus-per-host", type=int, default=4)
        parser.add_argument("--replicas", type=int, default=100)
        parser.add_argument("--max-unavailable", type=int, default=10)
        parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
        parser.add_argument(
            "--database-url",
            default=os.environ.get("FLEET_DATABASE_URL", ""),
            help="PostgreSQL server for the scratch database (default: FLEET_DATABASE_URL)",
        )
        parser.add_argument("--timeout", type=float, default=900.0, help="per rollout (s)")
        parser.add_argument("--workdir", type=Path, default=None, help="logs and configs")

    def handle(self, *args: Any, **options: Any) -> None:
        gpus, per_host = options["gpus"], options["gpus_per_host"]
        if not 1 <= gpus <= 1000 or not 1 <= per_host <= 8:
            raise CommandError("--gpus must be 1..1000 and --gpus-per-host 1..8")
        if not 0 <= options["replicas"] <= gpus * 4:
            raise CommandError("--replicas must fit in four 1g slices per GPU (0..4 x --gpus)")
        if not 1 <= options["max_unavailable"] <= 64:
            raise CommandError("--max-unavailable must be 1..64")
        if not str(options["database_url"]).startswith("postgres"):
            raise CommandError(
                "bench_rollout needs PostgreSQL: --database-url or FLEET_DATABASE_URL"
            )
        result = run_rollout_bench(
            RolloutOptions(
                gpus=gpus,
                gpus_per_host=per_host,
                replicas=options["replicas"],
                max_unavailable=options["max_unavailable"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                timeout_s=options["timeout"],
                log=lambda line: self.stderr.write(line),
            )
        )
        text = json.dumps(result, indent=2)
        if options["json"]:
            options["json"].write_text(text + "\n")
        self.stdout.write(text)
