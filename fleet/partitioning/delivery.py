"""Delivery of desired state to agents: push, record as dispatched, complete on ack."""

from __future__ import annotations

import logging

from django.db.models import Q
from django.utils import timezone

from fleet.core.events import agent_group, publish
from fleet.inventory.models import Host
from fleet.partitioning.models import Operation, OperationStatus
from fleet.partitioning.selectors import host_desired_state

logger = logging.getLogger(__name__)


def desired_state_push(*, host_id: int) -> bool:
    """Send the current generation to the agent's socket group; mark it dispatched.

    Safe to run twice or out of order: the dispatched generation only grows (compare-and-set).
    """
    host = Host.objects.filter(pk=host_id).first()
    if host is None:
        return False
    document = host_desired_state(host)
    generation = document["generation"]
    if generation <= host.applied_generation:
        return False
    sent = publish(agent_group(host_id), "agent.desired_state", {"message": dict(document)})
    now = timezone.now()
    Host.objects.filter(pk=host_id).filter(
        Q(dispatched_generation__lt=generation) | Q(dispatched_generation=generation)
    ).update(dispatched_generation=generation, dispatched_at=now)
    Operation.objects.filter(
        host_id=host_id, status=OperationStatus.PENDING, generation__lte=generation
    ).update(status=OperationStatus.DISPATCHED, dispatched_at=now)
    logger.debug(
        "pushed generation %s to host %s (delivered to layer: %s)", generation, host_id, sent
    )
    return sent
