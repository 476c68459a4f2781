"""``/partitions/``: MIG instances and whole-GPU partitions (read only)."""

from __future__ import annotations

from fleet.api.common import ReadViewSet, documented_reads
from fleet.api.filters import PartitionFilter
from fleet.api.resources.partitions.serializers import PartitionSerializer
from fleet.partitioning.models import Partition


@documented_reads(PartitionSerializer)
class PartitionViewSet(ReadViewSet[Partition]):
    """MIG instances and whole-GPU partitions (MPS-shared or dedicated)."""

    serializer_class = PartitionSerializer
    filterset_class = PartitionFilter
    ordering_fields = ["gpu", "start", "memory_mib"]
    queryset = Partition.objects.prefetch_related("allocations").order_by("gpu_id", "kind", "start")
