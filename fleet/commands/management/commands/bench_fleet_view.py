"""``manage.py bench_fleet_view --gpus 10000 --json OUT``: the fleet view's first render in
Chromium for a seeded scratch fleet of N GPUs (each ``--gpus``; default 1,000 and 10,000);
prints JSON.

See :mod:`fleet.bench.fleet_view` for what is measured and how.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from fleet.bench.fleet_view import ViewOptions, run_fleet_view_bench
from fleet.commands.bench import StackBenchCommand


class Command(StackBenchCommand):
    help = __doc__
    database_help = (
        "PostgreSQL server for a scratch database (default: FLEET_DATABASE_URL; without it, "
        "SQLite in a temporary directory)"
    )
    workdir_help = "scratch data and logs"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--gpus",
            type=int,
            action="append",
            default=[],
            help="fleet size (repeatable; default: 1000 and 10000)",
        )
        parser.add_argument("--repeat", type=int, default=3, help="loads per size (median)")
        parser.add_argument("--product", default="h100-sxm5-80gb")

    def handle(self, *args: Any, **options: Any) -> None:
        result = run_fleet_view_bench(
            ViewOptions(
                sizes=options["gpus"] or [1000, 10000],
                product=options["product"],
                repeat=options["repeat"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                log=self.log,
            )
        )
        self.emit(result, options)
