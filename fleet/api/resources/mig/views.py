"""The MIG catalog, the dry-run layout validator, and mig-parted import and export."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes, renderer_classes
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.api.common import READ_ERRORS, error_responses, validated
from fleet.api.limits import throttle_scope
from fleet.api.resources.mig.serializers import (
    CatalogProductSerializer,
    MigPartedImportSerializer,
    MigPartedLayoutSerializer,
    MigValidateResultSerializer,
    MigValidateSerializer,
)
from fleet.core.errors import NotFound, ServiceError
from fleet.core.permissions import AnyRole
from fleet.domain import Violation
from fleet.inventory.models import Gpu
from fleet.mig import (
    PRODUCTS,
    Instance,
    MigPartedError,
    Product,
    find_product,
    layout_to_migparted,
    migparted_to_layout,
    parse_migparted,
    product_by_key,
    render_migparted,
    resolve_instances,
    validate_layout,
)
from fleet.mig.planning import too_many_instances
from fleet.partitioning import converters


class YamlTextRenderer(BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return data.encode() if isinstance(data, str) else str(data).encode()


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
        "profiles": [{**p.as_dict(), "media": p.media} for p in product.profiles],
    }


@extend_schema(responses={200: CatalogProductSerializer(many=True), **error_responses(401, 403)})
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
    request=MigValidateSerializer,
    responses={200: MigValidateResultSerializer, **READ_ERRORS},
    description=(
        "Validate a MIG layout without changing anything. `valid: false` lists every violation."
    ),
)
@api_view(["POST"])
@permission_classes([AnyRole])
@throttle_scope("mig")
def validate(request: Request) -> Response:
    """Dry run of a MIG layout for a product or for one GPU (whose reported placements count)."""
    data = validated(MigValidateSerializer, request)
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
    too_many = too_many_instances(product, len(data["instances"]))
    if too_many is not None:  # refused before any per-instance or pairwise work
        return Response(
            {
                "valid": False,
                "product": product.name,
                "placements": [],
                "violations": [too_many.as_dict()],
            }
        )
    instances, unknown = resolve_instances(
        product, [(raw["profile"], raw["start"]) for raw in data["instances"]]
    )
    violations = list(unknown) or list(validate_layout(product, instances))
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


@extend_schema(
    request=MigPartedImportSerializer,
    responses={200: MigPartedLayoutSerializer, **READ_ERRORS},
    description=(
        "Turn an nvidia-mig-parted config into a layout with explicit placements for one GPU "
        "(a dry run: nothing changes). mig-parted stores counts; Fleet chooses the placements "
        "that keep large profiles placeable."
    ),
)
@api_view(["POST"])
@permission_classes([AnyRole])
@throttle_scope("mig")
def migparted_import(request: Request) -> Response:
    data = validated(MigPartedImportSerializer, request)
    gpu = Gpu.objects.filter(pk=data["gpu"]).first()
    if gpu is None:
        raise NotFound("gpu.not_found", f"GPU {data['gpu']} does not exist.", {"gpu": data["gpu"]})
    product = converters.product_of(gpu)
    if product is None:
        raise ServiceError("mig.unknown_product", f"Unknown GPU product {gpu.product_name!r}.")
    try:
        config = parse_migparted(data["yaml"])
    except MigPartedError as error:
        raise ServiceError("migparted.invalid", error.message, error.details) from None
    entries = config.config(data["config"])
    if entries is None:
        names = [name for name, _ in config.mig_configs]
        raise ServiceError(
            "migparted.unknown_config", f"No config named {data['config']!r}.", {"configs": names}
        )
    entry = next((e for e in entries if e.applies_to(product) and _covers(e, gpu.index)), None)
    if entry is None:
        return Response(
            {
                "valid": False,
                "layout": None,
                "violations": [
                    {
                        "code": "mig.device_filter_mismatch",
                        "message": f"No entry of {data['config']!r} applies to {gpu}.",
                        "details": {},
                    }
                ],
            }
        )
    result = migparted_to_layout(product, entry)
    violations = [v.as_dict() for v in result if isinstance(v, Violation)]
    if violations:
        return Response({"valid": False, "layout": None, "violations": violations})
    instances = [
        {"profile": _profile_name(product, i.profile_id), "start": i.start}
        for i in result
        if isinstance(i, Instance)
    ]
    layout = {"mode": "mig", "instances": instances} if entry.mig_enabled else {"mode": "dedicated"}
    return Response({"valid": True, "layout": layout, "violations": []})


def _profile_name(product: Product, profile_id: int) -> str:
    profile = product.profile(profile_id)
    return profile.name if profile is not None else str(profile_id)


def _covers(entry: Any, index: int) -> bool:
    return entry.devices == "all" or index in entry.devices


@extend_schema(
    responses={
        (200, "application/yaml"): OpenApiTypes.OBJECT,
        **error_responses(400, 401, 403, 404, 409),
    },
    description="The GPU's MIG layout as an nvidia-mig-parted config (profile counts; version v1).",
)
@api_view(["GET"])
@renderer_classes([JSONRenderer, YamlTextRenderer])
def migparted_export(request: Request, pk: int) -> HttpResponse:
    gpu = Gpu.objects.filter(pk=pk).first()
    if gpu is None:
        raise NotFound("gpu.not_found", f"GPU {pk} does not exist.", {"gpu": pk})
    product = converters.product_of(gpu)
    if product is None or gpu.mode != "mig":
        raise ServiceError("migparted.not_mig", f"{gpu} is not in MIG mode.", status_code=409)
    instances = converters.mig_instances(gpu.partitions.all())
    try:
        config = layout_to_migparted(
            product,
            instances,
            config_name=f"fleet-{gpu.host.name}-gpu{gpu.index}",
            devices=[gpu.index],
        )
    except MigPartedError as error:
        raise ServiceError(
            "migparted.invalid", error.message, error.details, status_code=409
        ) from None
    return HttpResponse(render_migparted(config), content_type="application/yaml; charset=utf-8")
