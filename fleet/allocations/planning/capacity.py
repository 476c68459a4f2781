"""Read: the fleet's capacity (what fits now, what is stranded) as JSON, for the API, the page and
``/metrics``. One snapshot and one request mix per call (a fixed number of queries, whatever the
fleet's size); the numbers come from :mod:`fleet.placement.capacity`."""

from __future__ import annotations

from typing import TypedDict

from fleet.allocations.selectors import fleet_snapshot, request_mix
from fleet.inventory.models import Gpu, Host
from fleet.mps import MpsRequest
from fleet.placement import MigRequest, PlacementRequest, WholeGpuRequest
from fleet.placement.capacity import (
    CapacityReport,
    HostFragmentation,
    ProductCapacity,
    RequestFit,
    capacity,
    request_fit,
)
from fleet.placement.fragment import MILLI


class ProfilePayload(TypedDict):
    profile: str
    profile_id: int
    fits_now: int
    fits_if_idle_reshaped: int


class MigPayload(TypedDict):
    gpus: int
    profiles: list[ProfilePayload]


class MpsPayload(TypedDict):
    gpus: int
    free_memory_mib: int
    stranded_memory_mib: int
    free_clients: int


class WholePayload(TypedDict):
    free_gpus: int


class ProductPayload(TypedDict):
    product: str
    product_key: str
    gpus: int
    schedulable_gpus: int
    mig: MigPayload
    mps: MpsPayload
    whole: WholePayload


class HostPayload(TypedDict):
    host_id: int
    host: str
    score: float
    free_gpu_equivalents: float
    stranded_gpu_equivalents: float


class FragmentationPayload(TypedDict):
    score: float
    stranded_gpu_equivalents: float
    free_gpu_equivalents: float
    hosts: list[HostPayload]


class RequestProductPayload(TypedDict):
    product: str
    product_key: str
    fits_now: int
    fits_if_idle_reshaped: int | None


class RequestPayload(TypedDict):
    kind: str
    profile: str | None
    memory_mib: int | None
    max_compute_percent: int | None
    gpu_count: int | None
    fits_now: int
    fits_if_idle_reshaped: int | None
    products: list[RequestProductPayload]


class CapacityPayload(TypedDict, total=False):
    products: list[ProductPayload]
    fragmentation: FragmentationPayload
    request: RequestPayload


def fleet_capacity(request: PlacementRequest | None = None) -> CapacityPayload:
    """The capacity of every GPU product, the fleet's fragmentation against its request mix,
    and, when ``request`` is given, how many replicas of it fit."""
    snapshot = fleet_snapshot()
    report = capacity(snapshot, request_mix())
    names = _product_names()
    hosts = dict(Host.objects.values_list("pk", "name"))
    payload: CapacityPayload = {
        "products": [_product(entry, names) for entry in report.products],
        "fragmentation": _fragmentation(report, hosts),
    }
    if request is not None:
        payload["request"] = _request(request, request_fit(snapshot, request), names)
    return payload


def _product_names() -> dict[str, str]:
    rows = Gpu.objects.order_by().values_list("product_key", "product_name").distinct()
    return dict(rows)


def _name(key: str, names: dict[str, str]) -> str:
    return names.get(key) or key or "unknown"


def _product(entry: ProductCapacity, names: dict[str, str]) -> ProductPayload:
    return {
        "product": _name(entry.product_key, names),
        "product_key": entry.product_key,
        "gpus": entry.gpus,
        "schedulable_gpus": entry.schedulable_gpus,
        "mig": {
            "gpus": entry.mig_gpus,
            "profiles": [
                {
                    "profile": p.profile,
                    "profile_id": p.profile_id,
                    "fits_now": p.fits_now,
                    "fits_if_idle_reshaped": p.fits_if_idle_reshaped,
                }
                for p in entry.profiles
            ],
        },
        "mps": {
            "gpus": entry.mps.gpus,
            "free_memory_mib": entry.mps.free_memory_mib,
            "stranded_memory_mib": entry.mps.stranded_memory_mib,
            "free_clients": entry.mps.free_clients,
        },
        "whole": {"free_gpus": entry.whole_free_gpus},
    }


def _fragmentation(report: CapacityReport, hosts: dict[int, str]) -> FragmentationPayload:
    return {
        "score": round(report.score, 3),
        "stranded_gpu_equivalents": round(report.stranded_gpu_equivalents, 2),
        "free_gpu_equivalents": round(report.free_milli / MILLI, 2),
        "hosts": [_host(h, hosts) for h in report.hosts],
    }


def _host(entry: HostFragmentation, hosts: dict[int, str]) -> HostPayload:
    return {
        "host_id": entry.host_id,
        "host": hosts.get(entry.host_id, str(entry.host_id)),
        "score": round(entry.score, 3),
        "free_gpu_equivalents": round(entry.free_milli / MILLI, 2),
        "stranded_gpu_equivalents": round(entry.fragmented_milli / MILLI, 2),
    }


def _request(request: PlacementRequest, fit: RequestFit, names: dict[str, str]) -> RequestPayload:
    return {
        "kind": _kind(request),
        "profile": str(request.profile) if isinstance(request, MigRequest) else None,
        "memory_mib": request.memory_mib if isinstance(request, MpsRequest) else None,
        "max_compute_percent": request.max_compute_percent
        if isinstance(request, MpsRequest)
        else None,
        "gpu_count": request.count if isinstance(request, WholeGpuRequest) else None,
        "fits_now": fit.fits_now,
        "fits_if_idle_reshaped": fit.fits_if_idle_reshaped,
        "products": [
            {
                "product": _name(key, names),
                "product_key": key,
                "fits_now": now,
                "fits_if_idle_reshaped": reshaped,
            }
            for key, now, reshaped in fit.products
        ],
    }


def _kind(request: PlacementRequest) -> str:
    if isinstance(request, MigRequest):
        return "mig"
    return "mps" if isinstance(request, MpsRequest) else "gpu"
