"""``manage.py mig_check``: does a set of MIG profiles fit on a GPU product, and where?

Exit status: 0 fits / valid, 1 does not fit / invalid (JSON explains), 2 bad usage.
"""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from fleet.domain import Violation
from fleet.mig import (
    NOT_SUPPORTED,
    PRODUCTS,
    Instance,
    NotationError,
    Product,
    UnknownProfileError,
    find_product,
    parse_instances,
    plan_layout,
    product_by_key,
    resolve_profiles,
    validate_layout,
)

USAGE_ERROR = 2

Outcome = tuple[tuple[Instance, ...], tuple[Violation, ...]]
"""The instances to print, and the violations (none when valid)."""


class Command(BaseCommand):
    help = (
        "Check MIG profiles against a GPU product: either whether PROFILES fit on an empty GPU "
        "(and where), or whether the explicit --placed layout is valid. Prints JSON."
    )
    # Pure computation on the built-in catalog: no database, URLs or models involved.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--gpu",
            required=True,
            help="product name ('NVIDIA A100-SXM4-40GB'), key ('a100-sxm4-40gb') or PCI id 0x20B0",
        )
        parser.add_argument("profiles", nargs="*", help="profile names or ids, e.g. 3g.20gb 1g.5gb")
        parser.add_argument("--placed", help="explicit layout instead, e.g. '3g.20gb@4,1g.5gb@0'")

    def handle(self, *args: Any, **options: Any) -> None:
        product = _product(options["gpu"])
        placed: str | None = options["placed"]
        profiles: list[str] = options["profiles"]
        if (placed is None) == (not profiles):
            raise CommandError("Give either profiles or --placed.", returncode=USAGE_ERROR)
        outcome: Outcome
        if not product.mig_capable:
            outcome = ((), (_not_supported(product),))
        elif placed is not None:
            outcome = _check_placed(product, placed)
        else:
            outcome = _fit(product, profiles)
        instances, violations = outcome
        self.stdout.write(json.dumps(_report(product, instances, violations), indent=2))
        if violations:
            sys.exit(1)


def _product(ref: str) -> Product:
    product = product_by_key(ref) or find_product(name=ref)
    if product is None and ref.lower().startswith("0x"):
        try:
            product = find_product(pci_device_id=int(ref, 16))
        except ValueError:
            product = None
    if product is None:
        known = "\n".join(f"  {p.key}: {p.name}" for p in PRODUCTS)
        raise CommandError(f"Unknown GPU {ref!r}. Known products:\n{known}", returncode=USAGE_ERROR)
    return product


def _usage(product: Product, error: Exception) -> CommandError:
    message = str(error)
    if not isinstance(error, UnknownProfileError):  # that message already lists the profiles
        known = ", ".join(f"{p.id} ({p.name})" for p in product.profiles)
        message += f"\nProfiles of {product.name}: {known}"
    return CommandError(message, returncode=USAGE_ERROR)


def _check_placed(product: Product, text: str) -> Outcome:
    try:
        instances = parse_instances(product, text)
    except (NotationError, UnknownProfileError) as exc:
        raise _usage(product, exc) from exc
    return instances, validate_layout(product, instances)


def _not_supported(product: Product) -> Violation:
    return Violation(
        NOT_SUPPORTED, f"{product.name} does not support MIG.", {"product": product.key}
    )


def _fit(product: Product, refs: list[str]) -> Outcome:
    try:
        resolve_profiles(product, refs)
    except UnknownProfileError as exc:
        raise _usage(product, exc) from exc
    plan = plan_layout(product, refs)
    return plan.instances, plan.violations


def _report(
    product: Product, instances: tuple[Instance, ...], violations: tuple[Violation, ...]
) -> dict[str, Any]:
    placements = []
    for instance in sorted(instances, key=lambda i: (i.start, i.profile_id)):
        profile = product.profile(instance.profile_id)
        assert profile is not None  # parse_instances / plan_layout only yield known profiles
        where = profile.placement_at(instance.start)
        placements.append({"profile": profile.name, "start": where.start, "size": where.size})
    return {
        "valid": not violations,
        "placements": [] if violations else placements,
        "violations": [{"code": v.code, "message": v.message} for v in violations],
    }
