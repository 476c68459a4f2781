"""FilterSets of the API lists. The GPU FilterSet lives in ``fleet.inventory.filters``: the fleet
page filters with it too, and sends its vocabulary to the browser."""

from __future__ import annotations

from typing import Any

import django_filters

from fleet.allocations.models import Allocation, Deployment, RequestKind, WorkloadState
from fleet.core.filters import IdFilter, UtcIsoDateTimeFilter
from fleet.core.models import AlertDelivery, DeliveryStatus
from fleet.inventory.models import HealthEvent, HealthEventKind, Host, HostStatus
from fleet.partitioning.models import Partition, PartitionKind


class HostFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=HostStatus.choices)
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")

    class Meta:
        model = Host
        fields = ["status", "name"]


class PartitionFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=PartitionKind.choices)
    gpu = IdFilter(field_name="gpu_id")
    host = IdFilter(field_name="gpu__host_id")
    free = django_filters.BooleanFilter(
        field_name="allocations", lookup_expr="isnull", distinct=True
    )

    class Meta:
        model = Partition
        fields = ["kind", "gpu", "profile_name", "mps_enabled"]


def filter_team(queryset: Any, name: str, value: str) -> Any:
    """``?team=`` takes a team's id or its slug."""
    value = value.strip()
    if value.isdecimal() and len(value) <= 18:
        return queryset.filter(team_id=int(value))
    return queryset.filter(team__slug=value)


class DeploymentFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=RequestKind.choices)
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")
    team = django_filters.CharFilter(
        method=filter_team, max_length=100, label="Team (its id or slug)"
    )

    class Meta:
        model = Deployment
        fields = ["kind", "profile", "name", "team"]


class AllocationFilter(django_filters.FilterSet):
    deployment = IdFilter(field_name="deployment_id")
    gpu = IdFilter(field_name="gpu_id")
    host = IdFilter(field_name="gpu__host_id")
    partition = IdFilter(field_name="partition_id")
    workload_state = django_filters.ChoiceFilter(choices=WorkloadState.choices)

    class Meta:
        model = Allocation
        fields = ["deployment", "gpu", "partition", "kind", "state", "workload_state"]


class HealthEventFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=HealthEventKind.choices)
    host = IdFilter(field_name="host_id")
    gpu = IdFilter(field_name="gpu_id")
    since = UtcIsoDateTimeFilter(field_name="ts", lookup_expr="gte")

    class Meta:
        model = HealthEvent
        fields = ["kind", "host", "gpu", "since"]


class DeliveryFilter(django_filters.FilterSet):
    webhook = IdFilter(field_name="webhook_id")
    status = django_filters.ChoiceFilter(choices=DeliveryStatus.choices)
    event = django_filters.CharFilter(max_length=64)

    class Meta:
        model = AlertDelivery
        fields = ["webhook", "status", "event"]
