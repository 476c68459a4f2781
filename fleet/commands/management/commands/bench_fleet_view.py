"""``manage.py bench_fleet_view --gpus 10000 --json OUT``: the fleet view's first render in
Chromium for a seeded scratch fleet of N GPUs (each ``--gpus``; default 1,000 and 10,000);
prints JSON.

See :mod:`fleet.bench.fleet_view` for what is measured and how.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet.bench.fleet_view import ViewOptions, run_fleet_view_bench


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--gpus",
            type=int,
            action="append",
            default=[],
            help="fleet size (repeatable; default: 1000 and 10000)",
        )
        parser.add_argument("--repeat", type=int, default=3, help="loads per size (median)")
        parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
        parser.add_argument("--product", default="h100-sxm5-80gb")
        parser.add_argument(
            "--database-url",
            default=os.environ.get("FLEET_DATABASE_URL", ""),
            help="PostgreSQL server for a scratch database (default: FLEET_DATABASE_URL; "
            "without it, SQLite in a temporary directory)",
        )
        parser.add_argument("--workdir", type=Path, default=None, help="scratch data and logs")

    def handle(self, *args: Any, **options: Any) -> None:
        result = run_fleet_view_bench(
            ViewOptions(
                sizes=options["gpus"] or [1000, 10000],
                product=options["product"],
                repeat=options["repeat"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                log=lambda line: self.stderr.write(line),
            )
        )
        text = json.dumps(result, indent=2)
        self.stdout.write(text)
        if options["json"] is not None:
            options["json"].write_text(text + "\n", encoding="utf-8")
