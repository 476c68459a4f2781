"""The MIG catalog and the dry-run layout validator."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api import serializers as s
from fleet.api.views import READ_ERRORS, _errors, _valid
from fleet.core.errors import NotFound, ServiceError
from fleet.core.permissions import AnyRole
from fleet.domain import Violation
from fleet.inventory.models import Gpu
from fleet.mig import PRODUCTS, Instance, Product, find_product, product_by_key, validate_layout
from fleet.partitioning import converters


def product_as_dict(product: Product) -> dict[str, Any]:
    return {
        "key": product.key,
        "name": product.name,
        "aliases": list(product.aliases),
        "pci_device_ids": [f"0x{pci:04X}" for pci in product.pci_device_ids],
        "memory_mib": product.memory_mib,
        "mig_capable": product.mig_capable,
        "memory_slice_count": product.memory_slice_count,
        "compute_slice_count": product.compute_slice_count,
        "max_instances": product.max_instances,
        "profiles": [
            {
                "id": p.id,
                "name": p.name,
                "compute_slices": p.compute_slices,
                "memory_slices": p.memory_slices,
                "memory_mib": p.memory_mib,
                "max_instances": p.max_instances,
                "media": p.media,
                "placements": [[pl.start, pl.size] for pl in p.placements],
            }
            for p in product.profiles
        ],
    }


@extend_schema(responses={200: s.CatalogProductSerializer(many=True), **_errors(401, 403)})
@api_view(["GET"])
def catalog(request: Request) -> Response:
    """Every GPU product Fleet knows, with its MIG profiles and their allowed placements."""
    return Response([product_as_dict(p) for p in PRODUCTS])


def lookup_product(ref: str) -> Product | None:
    ref = ref.strip()
    product = product_by_key(ref) or find_product(name=ref)
    if product is None and ref.lower().startswith("0x"):
        try:
            product = find_product(pci_device_id=int(ref, 16))
        except ValueError:
            return None
    return product


@extend_schema(
    request=s.MigValidateSerializer,
    responses={200: s.MigValidateResultSerializer, **READ_ERRORS},
    description=(
        "Validate a MIG layout without changing anything. `valid: false` lists every violation."
    ),
)
@api_view(["POST"])
@permission_classes([AnyRole])
def validate(request: Request) -> Response:
    """Dry run of a MIG layout for a product or for one GPU (whose reported placements count)."""
    data = _valid(s.MigValidateSerializer, request)
    if "gpu" in data:
        gpu = Gpu.objects.filter(pk=data["gpu"]).first()
        if gpu is None:
            raise NotFound(
                "gpu.not_found", f"GPU {data['gpu']} does not exist.", {"gpu": data["gpu"]}
            )
        product = converters.product_of(gpu)
        label = gpu.product_name
    else:
        product = lookup_product(data["product"])
        label = data["product"]
    if product is None:
        raise ServiceError(
            "mig.unknown_product",
            f"Unknown GPU product {label!r}.",
            {"known_products": [p.name for p in PRODUCTS]},
        )
    instances: list[Instance] = []
    violations: list[Violation] = []
    for raw in data["instances"]:
        ref = int(raw["profile"]) if raw["profile"].isdigit() else raw["profile"]
        profile = product.profile(ref)
        if profile is None:
            violations.append(
                Violation(
                    "mig.unknown_profile",
                    f"{product.name} has no profile {raw['profile']!r}.",
                    {
                        "profile": raw["profile"],
                        "known_profiles": [p.name for p in product.profiles],
                    },
                )
            )
            continue
        instances.append(Instance(profile_id=profile.id, start=raw["start"]))
    if not violations:
        violations.extend(validate_layout(product, instances))
    placements = []
    for instance in instances:
        profile = product.profile(instance.profile_id)
        assert profile is not None
        where = profile.placement_at(instance.start)
        placements.append(
            {
                "profile": profile.name,
                "profile_id": profile.id,
                "start": where.start,
                "size": where.size,
            }
        )
    return Response(
        {
            "valid": not violations,
            "product": product.name,
            "placements": placements if not violations else [],
            "violations": [v.as_dict() for v in violations],
        }
    )
