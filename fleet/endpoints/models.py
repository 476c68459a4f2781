"""An endpoint: the one address at which a deployment answers, through a Fleet gateway."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.allocations.models import Deployment
from fleet.core.models import TimeStampedModel
from hostagent.protocol import MAX_DRAIN_S

DEFAULT_DRAIN_S = 5
"""A copy's drain before SIGTERM unless its endpoint says otherwise: the gateways take it out of
rotation within a second (their update lag), and short requests in flight finish."""


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
    # Seconds a copy stays up out of rotation before it is stopped (``drain_s`` of each
    # desired allocation: the agent waits that long, reported stopping, before SIGTERM).
    drain_s = models.PositiveSmallIntegerField(default=DEFAULT_DRAIN_S)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(path_prefix__isnull=False) | Q(hostname__isnull=False),
                name="endpoint_has_a_route",
            ),
            models.CheckConstraint(
                condition=Q(drain_s__lte=MAX_DRAIN_S), name="endpoint_drain_bounded"
            ),
        ]

    def __str__(self) -> str:
        return f"endpoint of {self.deployment_id}: {self.hostname or ''}{self.path_prefix or ''}"


class Traffic(models.Model):
    """What one gateway last measured of one copy of an endpoint, over its meter's window
    (:mod:`fleet.endpoints.metering`): ``allocation_id`` 0 is the endpoint's backend as a whole
    (every request, and those queued before any copy took them). Plain ids, not foreign keys: a
    reading may name a copy that has just gone, and rows are replaced every second."""

    gateway = models.CharField(max_length=64)
    deployment_id = models.PositiveBigIntegerField()
    allocation_id = models.PositiveBigIntegerField()
    state = models.CharField(max_length=16)
    requests_per_s = models.FloatField(null=True)
    errors_per_s = models.FloatField(null=True)
    in_flight = models.PositiveIntegerField()
    queued = models.PositiveIntegerField()
    response_ms = models.FloatField(null=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gateway", "deployment_id", "allocation_id"], name="traffic_one_row"
            )
        ]
        indexes = [models.Index(fields=["deployment_id", "updated_at"])]

    def __str__(self) -> str:
        return f"traffic of {self.deployment_id}/{self.allocation_id} via {self.gateway}"


class TrafficPoint(models.Model):
    """One point of an endpoint's traffic history as one gateway measured it: the reading of the
    last second of each :data:`fleet.endpoints.history.POINT_S` bucket (the meter's window is
    5 s, so points 10 s apart miss nothing but its jitter), kept for
    :data:`fleet.endpoints.history.KEEP`. Several gateways add up when read. Plain ids, as
    :class:`Traffic`."""

    gateway = models.CharField(max_length=64)
    deployment_id = models.PositiveBigIntegerField()
    ts = models.DateTimeField()  # the bucket's start
    requests_per_s = models.FloatField(null=True)
    errors_per_s = models.FloatField(null=True)
    in_flight = models.PositiveIntegerField()
    queued = models.PositiveIntegerField()
    response_ms = models.FloatField(null=True)
    ready_replicas = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gateway", "deployment_id", "ts"], name="traffic_point_one_per_bucket"
            )
        ]
        indexes = [
            models.Index(fields=["deployment_id", "ts"]),
            models.Index(fields=["ts"]),
        ]

    def __str__(self) -> str:
        return f"traffic of {self.deployment_id} at {self.ts} via {self.gateway}"
