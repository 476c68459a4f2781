"""``manage.py bench_refusals --repeat 50 --json OUT``: how long the server takes to refuse a
viewer's oversized and hostile requests (a mig-parted bomb, deep JSON, bodies over their caps);
prints JSON.

See :mod:`fleet.bench.refusals` for what is measured and how.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from fleet.bench.refusals import RefusalOptions, run_refusal_bench
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
        parser.add_argument("--repeat", type=int, default=50, help="requests per case (1..1000)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["repeat"] <= 1000:
            raise CommandError("--repeat must be between 1 and 1000")
        result = run_refusal_bench(
            RefusalOptions(
                repeat=options["repeat"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                log=self.log,
            )
        )
        self.emit(result, options)
