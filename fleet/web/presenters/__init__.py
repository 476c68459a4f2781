"""Rows to view models: what a GPU card, a deployment card and a partition row show.

The templates only format these values; the colours (heat buckets), the geometry of the slice
grid and the "pending" outlines are decided here, once, for the first render and for every
fragment the live updates fetch. One module per thing shown; this package re-exports them so
``from fleet.web.presenters import …`` keeps working.
"""

from __future__ import annotations

from fleet.web.presenters.deployment_cards import (
    DeploymentCard,
    TrayFit,
    TraySection,
    deployment_card,
    tray_sections,
)
from fleet.web.presenters.fleet import FleetSummary, HostGroup, fleet_summary, host_groups
from fleet.web.presenters.formats import (
    NA_TITLE,
    format_mib,
    format_mib_pair,
    heat_bucket,
    utilization_value,
)
from fleet.web.presenters.gpu_cards import (
    UNHEALTHY,
    AllocationView,
    GpuCard,
    Live,
    SliceView,
    gpu_card,
    safe_gpu_card,
)
from fleet.web.presenters.partitions import PartitionRow, partition_rows

__all__ = [
    "NA_TITLE",
    "UNHEALTHY",
    "AllocationView",
    "DeploymentCard",
    "FleetSummary",
    "GpuCard",
    "HostGroup",
    "Live",
    "PartitionRow",
    "SliceView",
    "TrayFit",
    "TraySection",
    "deployment_card",
    "fleet_summary",
    "format_mib",
    "format_mib_pair",
    "gpu_card",
    "heat_bucket",
    "host_groups",
    "partition_rows",
    "safe_gpu_card",
    "tray_sections",
    "utilization_value",
]
