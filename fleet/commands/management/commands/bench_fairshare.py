"""``manage.py bench_fairshare [--gpus 1024] [--window 7200] [--load 1.3] [--json OUT]``: hard
caps against Fleet's borrowing and reclaim on the openb trace's churn, five teams, a phase where
team A is idle while the others borrow, then A's load returns; prints JSON.

See :mod:`fleet.placement.benchmarks.fairshare` for the model, the trace's scaling and the rule
that assigns pods to teams.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.mig import product_by_key
from fleet.placement.benchmarks.fairshare import FairshareOptions, run_fairshare
from fleet.placement.benchmarks.trace import parse_pods

TRACE = Path("..") / "shared" / "data" / "alibaba-gpu-v2023" / "csv" / "openb_pod_list_default.csv"


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--gpus", type=int, default=1024, help="H100 GPUs, 8 a host (8..8192)")
        parser.add_argument(
            "--window", type=float, default=7200.0, help="simulated seconds (300..86400)"
        )
        parser.add_argument(
            "--load", type=float, default=1.3, help="offered load over the fleet (0.2..3)"
        )
        parser.add_argument(
            "--wit-every",
            type=float,
            default=120.0,
            help="simulated seconds between what-would-it-take samples (5..3600)",
        )
        parser.add_argument(
            "--no-queue-defrag",
            action="store_true",
            help="the engine does not carry out the head of the queue's moves "
            "(FLEET_QUEUE_DEFRAG=0)",
        )
        parser.add_argument("--pods", type=Path, default=None, help="an openb pod list CSV")
        parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 8 <= options["gpus"] <= 8192:
            raise CommandError("--gpus must be between 8 and 8192")
        if not 300 <= options["window"] <= 86400:
            raise CommandError("--window must be between 300 and 86400 seconds")
        if not 0.2 <= options["load"] <= 3:
            raise CommandError("--load must be between 0.2 and 3")
        if not 5 <= options["wit_every"] <= 3600:
            raise CommandError("--wit-every must be between 5 and 3600 seconds")
        path = options["pods"] or (Path(settings.BASE_DIR) / TRACE).resolve()
        if not path.is_file():
            raise CommandError(
                f"{path} does not exist (the shared data folder is ../shared/data).",
                returncode=2,
            )
        import csv

        with path.open(newline="") as handle:
            pods = parse_pods(csv.DictReader(handle))
        product = product_by_key("h100-sxm5-80gb")
        assert product is not None
        fairshare = FairshareOptions(
            gpus=options["gpus"],
            window_s=options["window"],
            load=options["load"],
            wit_every_s=options["wit_every"],
            queue_defrag=not options["no_queue_defrag"],
        )
        try:
            result = run_fairshare(pods, product, fairshare)
        except ValueError as error:
            raise CommandError(str(error), returncode=2) from error
        text = json.dumps(result, indent=2)
        self.stdout.write(text)
        if options["json"] is not None:
            options["json"].write_text(text + "\n", encoding="utf-8")
