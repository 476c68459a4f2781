"""``manage.py bench_runtime --replicas N --json OUT``: how fast one agent runs, starts, stops
and adopts workloads on the production stack (its own, on loopback), with the Docker runtime and
a locally built image; prints JSON. See :mod:`fleet.bench.runtime` for what is measured."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.bench.runtime import RuntimeOptions, run_runtime_bench


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--replicas", type=int, default=20)
        parser.add_argument("--runtime", choices=["docker", "process"], default="docker")
        parser.add_argument("--image", default="fleet-test/busybox:1", help="a local image")
        parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
        parser.add_argument(
            "--database-url",
            default=os.environ.get("FLEET_DATABASE_URL", ""),
            help="PostgreSQL server for the scratch database (default: FLEET_DATABASE_URL)",
        )
        parser.add_argument("--timeout", type=float, default=120.0, help="per step (s)")
        parser.add_argument("--workdir", type=Path, default=None, help="logs and configs")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["replicas"] <= 700:
            raise CommandError("--replicas must be between 1 and 700")
        if not str(options["database_url"]).startswith("postgres"):
            raise CommandError(
                "bench_runtime needs PostgreSQL: --database-url or FLEET_DATABASE_URL"
            )
        result = run_runtime_bench(
            RuntimeOptions(
                replicas=options["replicas"],
                runtime=options["runtime"],
                image=options["image"],
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
