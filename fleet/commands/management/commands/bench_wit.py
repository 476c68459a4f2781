"""``manage.py bench_wit [--hosts 40] [--cold 20] [--json OUT]``: the latency of "what would it
take?" for every waiting replica of a seeded fleet (8 GPUs per host); prints JSON.

See :mod:`fleet.bench.wit` for what is measured and how.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.bench.wit import WitOptions, run_wit_bench


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hosts", type=int, default=40, help="hosts of 8 H100s (1..500)")
        parser.add_argument("--cold", type=int, default=20, help="cache misses to time (0..500)")
        parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["hosts"] <= 500:
            raise CommandError("--hosts must be between 1 and 500")
        if not 0 <= options["cold"] <= 500:
            raise CommandError("--cold must be between 0 and 500")
        result = run_wit_bench(WitOptions(hosts=options["hosts"], cold=options["cold"]))
        text = json.dumps(result, indent=2)
        self.stdout.write(text)
        if options["json"] is not None:
            options["json"].write_text(text + "\n", encoding="utf-8")
