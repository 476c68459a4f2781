"""The GPU filter: one definition of what each filter means, shared by the API's ``/gpus/`` list,
the fleet page's server-side filtering and, through the page config, the browser's client-side
filtering of the cards (``static/web/fleet/filters.js`` applies the same ``match`` kinds to the
``data-*`` attributes the server renders).

It sits on the inventory floor so both interfaces (``fleet.api``, ``fleet.web``) may import it.
Two filters reach rows of higher floors (partitions, allocations, deployments) through the
reverse relations of ``Gpu`` by name only; nothing from those apps is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import django_filters
from django.db.models import CharField, Q, QuerySet, Value
from django.db.models.functions import Cast, Concat
from django_filters.widgets import BooleanWidget

from fleet.core.filters import IdFilter
from fleet.inventory.models import Gpu, GpuHealth, SharingMode

MatchKind = Literal["terms", "exact", "contains", "flag"]
"""How a filter matches, on the server and in the browser:

- ``terms``: every whitespace-separated term appears (case-insensitive) in the GPU's search text;
- ``exact``: the value equals the GPU's value (one of the filter's choices);
- ``contains``: the GPU's value contains the given text (case-insensitive);
- ``flag``: ``true``/``1`` keeps GPUs where the flag is set, ``false``/``0`` those where it is not.
"""

FLAG_TRUE = ("true", "1")
FLAG_FALSE = ("false", "0")

Choices = tuple[tuple[str, str], ...]
Method = Callable[[QuerySet[Gpu], str, Any], QuerySet[Gpu]]


class FilterJson(TypedDict):
    """One filter as the page config sends it to the browser."""

    name: str
    label: str
    match: MatchKind
    help: str
    choices: list[list[str]]


@dataclass(frozen=True)
class FilterSpec:
    """One filter: its query parameter, how it matches, and the values it takes.

    ``model_field`` is the ``Gpu`` field it reads (default: ``name``); ``method`` replaces the
    field lookup where the meaning spans rows (search terms, allocations).
    """

    name: str
    label: str
    match: MatchKind
    help: str
    choices: Choices = ()
    model_field: str = ""
    method: Method | None = field(default=None, compare=False, repr=False)

    def as_json(self, choices: Iterable[tuple[str, str]] | None = None) -> FilterJson:
        """The browser's view of the filter; ``choices`` overrides the static ones (products)."""
        found = self.choices if choices is None else tuple(choices)
        return {
            "name": self.name,
            "label": self.label,
            "match": self.match,
            "help": self.help,
            "choices": [[value, label] for value, label in found],
        }

    def as_filter(self) -> django_filters.Filter:
        """The django-filter filter that applies this meaning to a ``Gpu`` queryset."""
        common: dict[str, Any] = {
            "field_name": self.model_field or self.name,
            "label": self.label,
            "help_text": self.help,
        }
        if self.match == "flag":
            return django_filters.BooleanFilter(widget=BooleanWidget, method=self.method, **common)
        if self.method is not None:
            return django_filters.CharFilter(method=self.method, **common)
        if self.match == "exact":
            return django_filters.ChoiceFilter(choices=self.choices, **common)
        if self.match == "contains":
            return django_filters.CharFilter(lookup_expr="icontains", **common)
        raise ValueError(f"a {self.match} filter needs a method")


def _has_term(term: str) -> Q:
    """The GPUs whose search text contains ``term``: host name, ``gpu<index>``, product, UUID,
    mode, MIG profile names and the names of the deployments placed on it (the same text as
    ``fleet.web.presenters.GpuCard.search_text``, which the browser searches)."""
    labelled = Gpu.objects.annotate(label=Concat(Value("gpu"), Cast("index", CharField())))
    return (
        Q(host__name__icontains=term)
        | Q(product_name__icontains=term)
        | Q(uuid__icontains=term)
        | Q(mode__icontains=term)
        | Q(pk__in=labelled.filter(label__icontains=term).values("pk"))
        | Q(pk__in=Gpu.objects.filter(partitions__profile_name__icontains=term).values("pk"))
        | Q(pk__in=Gpu.objects.filter(allocations__deployment__name__icontains=term).values("pk"))
    )


def _every_term(queryset: QuerySet[Gpu], name: str, value: str) -> QuerySet[Gpu]:
    for term in value.lower().split():
        queryset = queryset.filter(_has_term(term))
    return queryset


def _free(queryset: QuerySet[Gpu], name: str, value: bool) -> QuerySet[Gpu]:
    allocated = Gpu.objects.filter(allocations__isnull=False).values("pk")
    return queryset.exclude(pk__in=allocated) if value else queryset.filter(pk__in=allocated)


GPU_FILTERS: tuple[FilterSpec, ...] = (
    FilterSpec(
        "q",
        "Search",
        "terms",
        "Every space-separated term appears (case-insensitive) in the host name, `gpu<index>`, "
        "product, UUID, sharing mode, a MIG profile or a deployment placed on the GPU.",
        method=_every_term,
    ),
    FilterSpec(
        "mode", "Sharing mode", "exact", "The GPU's sharing mode.", tuple(SharingMode.choices)
    ),
    FilterSpec(
        "product",
        "Product",
        "contains",
        "The product name contains this text (case-insensitive): `H100`, `NVIDIA A30`.",
        model_field="product_name",
    ),
    FilterSpec("health", "Health", "exact", "The GPU's health.", tuple(GpuHealth.choices)),
    FilterSpec(
        "cordoned",
        "Cordoned",
        "flag",
        "`true`: cordoned GPUs only (no new work lands on them); `false`: uncordoned only.",
    ),
    FilterSpec(
        "free",
        "Free",
        "flag",
        "`true`: GPUs with no allocation (no replica, pending or active, on any of their "
        "partitions); `false`: GPUs with at least one.",
        method=_free,
    ),
)

GPU_FILTER_NAMES = tuple(spec.name for spec in GPU_FILTERS)


def _gpu_filterset() -> type[Any]:
    """The FilterSet of ``GPU_FILTERS``, plus the API's lookups by key (host, UUID, MIG support)."""
    attrs: dict[str, Any] = {spec.name: spec.as_filter() for spec in GPU_FILTERS}
    attrs |= {
        "host": IdFilter(field_name="host_id"),
        "host_name": django_filters.CharFilter(field_name="host__name"),
        "mig_capable": django_filters.BooleanFilter(widget=BooleanWidget),
        "Meta": type("Meta", (), {"model": Gpu, "fields": ["uuid"]}),
        "__module__": __name__,
        "__doc__": "GPUs by the filters of ``GPU_FILTERS`` and by host, UUID and MIG support.",
    }
    return type("GpuFilter", (django_filters.FilterSet,), attrs)


GpuFilter = _gpu_filterset()


def filter_gpus(queryset: QuerySet[Gpu], params: Any) -> QuerySet[Gpu]:
    """``queryset`` narrowed by the GPU filters in ``params`` (a QueryDict); a filter whose value
    is not valid (an unknown mode) is left out rather than refused, as a page should."""
    narrowed: QuerySet[Gpu] = GpuFilter(params, queryset=queryset).qs
    return narrowed
