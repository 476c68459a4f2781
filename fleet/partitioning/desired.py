"""The desired-state primitives every writer shares: lock a GPU's rows, bump a host's
generation, and schedule the push of its desired state.

They sit low (only inventory rows below them) so that partitioning, allocations and the agents
app can all use them without importing each other. The push is a Celery task sent by name.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from fleet.core.errors import NotFound
from fleet.core.jobs import enqueue
from fleet.inventory.models import Gpu, Host

PUSH_DESIRED_STATE = "fleet.push_desired_state"


def lock_gpu(gpu_id: int) -> Gpu:
    """Lock the GPU's host, then the GPU, for the rest of the transaction."""
    host_id = Gpu.objects.filter(pk=gpu_id).values_list("host_id", flat=True).first()
    if host_id is None:
        raise NotFound("gpu.not_found", f"GPU {gpu_id} does not exist.", {"gpu": gpu_id})
    Host.objects.select_for_update().get(pk=host_id)
    return Gpu.objects.select_for_update().select_related("host").get(pk=gpu_id)


def host_bump_generation(host_id: int) -> int:
    """Increment the host's desired generation (inside the caller's transaction) and return it."""
    Host.objects.filter(pk=host_id).update(desired_generation=F("desired_generation") + 1)
    return int(Host.objects.values_list("desired_generation", flat=True).get(pk=host_id))


def schedule_push(host_id: int) -> None:
    """After commit, ask a worker to push the host's current desired state to its agent."""
    transaction.on_commit(lambda: enqueue(PUSH_DESIRED_STATE, host_id))
