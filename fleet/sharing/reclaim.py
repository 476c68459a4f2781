"""The reclaim preview: what Fleet would do to place a deployment's next replica that its team's
deserved share entitles, on the fleet as it is now (:func:`fleet.placement.reclaim.reclaim_plan`,
read-only: nothing is moved or stopped here; the reclaim workflow,
:mod:`fleet.workflows.reclaim`, carries the same plan out).

Only a replica within its team's deserved share may reclaim; borrowed replicas of *other* teams
are what it may move or stop.
"""

from __future__ import annotations

from fleet.allocations.models import Deployment
from fleet.allocations.reclaims import (
    NOT_ENTITLED,
    Preview,
    allocation_key,
    borrowed_of_others,
    reclaim_plan_of,
)
from fleet.core.errors import NotFound

__all__ = ["NOT_ENTITLED", "Preview", "allocation_key", "borrowed_of_others", "reclaim_preview"]


def reclaim_preview(deployment_id: int) -> Preview:
    """What a reclaim would do for the deployment's next replica (raises 404 for none)."""
    deployment = Deployment.objects.select_related("team").filter(pk=deployment_id).first()
    if deployment is None:
        raise NotFound(
            "deployment.not_found",
            f"Deployment {deployment_id} does not exist.",
            {"deployment": deployment_id},
        )
    return reclaim_plan_of(deployment)
