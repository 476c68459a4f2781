"""``python manage.py simulated_gpus a30-24gb [--count N]``: print the simulation file of a
simulated GPU host (``fleet-agent --simulate FILE``, ``FLEET_AGENT_SIMULATE``), its GPUs
generated from the MIG catalog: to try Fleet, or an install, without a GPU (README, "Install")."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.inventory.simulation import simulated_spec
from fleet.mig import PRODUCTS, product_by_key


class Command(BaseCommand):
    help = "Print a simulated GPU host's specs (fleet-agent --simulate FILE) from the catalog."

    def add_arguments(self, parser: CommandParser) -> None:
        keys = ", ".join(product.key for product in PRODUCTS)
        parser.add_argument("product", help=f"the GPU model: {keys}")
        parser.add_argument("--count", type=int, default=1, help="how many GPUs (1 to 16)")
        parser.add_argument("--seed", type=int, default=0, help="the simulation's seed")

    def handle(self, *args: Any, **options: Any) -> None:
        product = product_by_key(options["product"])
        if product is None:
            known = ", ".join(p.key for p in PRODUCTS)
            raise CommandError(f"unknown GPU model {options['product']!r}: one of {known}")
        if not 1 <= options["count"] <= 16:
            raise CommandError("--count: 1 to 16")
        gpus = [simulated_spec(product) for _ in range(options["count"])]
        self.stdout.write(json.dumps({"seed": options["seed"], "gpus": gpus}, indent=1))
