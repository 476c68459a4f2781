"""An endpoint: the one address at which a deployment answers, through a Fleet gateway."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.allocations.models import Deployment
from fleet.core.models import TimeStampedModel


class Endpoint(TimeStampedModel):
    """Requests whose ``Host`` is ``hostname``, or whose path starts with ``path_prefix``, go to
    the deployment's ready replicas, on each one's host port for its declared port ``port``.
    ``slot``: the gateway backend (``ep_<slot>``) that holds its replicas."""

    deployment = models.OneToOneField(
        Deployment, primary_key=True, on_delete=models.CASCADE, related_name="endpoint"
    )
    port = models.CharField(max_length=15)
    path_prefix = models.CharField(max_length=128, null=True, blank=True, unique=True)
    hostname = models.CharField(max_length=253, null=True, blank=True, unique=True)
    slot = models.PositiveIntegerField(unique=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(path_prefix__isnull=False) | Q(hostname__isnull=False),
                name="endpoint_has_a_route",
            )
        ]

    def __str__(self) -> str:
        return f"endpoint of {self.deployment_id}: {self.hostname or ''}{self.path_prefix or ''}"
