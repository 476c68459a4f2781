"""FilterSets shared by the API lists (and later the dashboard's lists)."""

from __future__ import annotations

import django_filters

from fleet.allocations.models import Allocation, Deployment, RequestKind
from fleet.inventory.models import Gpu, GpuHealth, Host, HostStatus, SharingMode
from fleet.partitioning.models import (
    Operation,
    OperationKind,
    OperationStatus,
    Partition,
    PartitionKind,
)


class HostFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=HostStatus.choices)
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")

    class Meta:
        model = Host
        fields = ["status", "name"]


class GpuFilter(django_filters.FilterSet):
    mode = django_filters.ChoiceFilter(choices=SharingMode.choices)
    health = django_filters.ChoiceFilter(choices=GpuHealth.choices)
    product = django_filters.CharFilter(field_name="product_name", lookup_expr="icontains")
    host = django_filters.NumberFilter(field_name="host_id")
    host_name = django_filters.CharFilter(field_name="host__name")

    class Meta:
        model = Gpu
        fields = ["mode", "health", "cordoned", "mig_capable", "host", "uuid"]


class PartitionFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=PartitionKind.choices)
    gpu = django_filters.NumberFilter(field_name="gpu_id")
    host = django_filters.NumberFilter(field_name="gpu__host_id")
    free = django_filters.BooleanFilter(
        field_name="allocations", lookup_expr="isnull", distinct=True
    )

    class Meta:
        model = Partition
        fields = ["kind", "gpu", "profile_name", "mps_enabled"]


class DeploymentFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=RequestKind.choices)
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")

    class Meta:
        model = Deployment
        fields = ["kind", "profile", "name"]


class AllocationFilter(django_filters.FilterSet):
    deployment = django_filters.NumberFilter(field_name="deployment_id")
    gpu = django_filters.NumberFilter(field_name="gpu_id")
    host = django_filters.NumberFilter(field_name="gpu__host_id")
    partition = django_filters.NumberFilter(field_name="partition_id")

    class Meta:
        model = Allocation
        fields = ["deployment", "gpu", "partition", "kind", "state"]


class OperationFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=OperationKind.choices)
    status = django_filters.ChoiceFilter(choices=OperationStatus.choices)
    host = django_filters.NumberFilter(field_name="host_id")
    gpu = django_filters.NumberFilter(field_name="gpu_id")
    deployment = django_filters.NumberFilter(field_name="deployment_id")
    requested_by = django_filters.CharFilter(field_name="requested_by__username")

    class Meta:
        model = Operation
        fields = ["kind", "status", "host", "gpu", "deployment"]
