"""``/events/``: health events (read only)."""

from __future__ import annotations

from fleet.api.common import ReadViewSet, documented_reads
from fleet.api.filters import HealthEventFilter
from fleet.api.resources.events.serializers import HealthEventSerializer
from fleet.inventory.models import HealthEvent


@documented_reads(HealthEventSerializer)
class HealthEventViewSet(ReadViewSet[HealthEvent]):
    """What agents reported: Xid and ECC errors, MPS and GPU loss, workload crash loops and
    orphans stopped, hosts going offline; kept 30 days."""

    serializer_class = HealthEventSerializer
    filterset_class = HealthEventFilter
    ordering_fields = ["ts"]
    queryset = HealthEvent.objects.order_by("-ts", "-id")
