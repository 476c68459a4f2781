"""Workloads (deployments) and their replicas bound to capacity (allocations)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from fleet.core.models import TimeStampedModel
from fleet.inventory.models import Gpu
from fleet.partitioning.models import Partition


class RequestKind(models.TextChoices):
    MIG = "mig", "MIG profile"
    MPS = "mps", "MPS share"
    GPU = "gpu", "Whole GPUs"


class Deployment(TimeStampedModel):
    """A workload: a name, a request and a replica count.

    Requests follow the AWS seeds: ``mig`` asks for one partition profile per replica
    (SageMaker); ``mps`` asks for GPU memory and optionally a compute cap (ECS); ``gpu`` asks for
    ``gpu_count`` whole GPUs on one host per replica.
    """

    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=8, choices=RequestKind.choices)
    profile = models.CharField(max_length=32, blank=True)
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    max_compute_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    replicas = models.PositiveSmallIntegerField(default=1)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(replicas__gte=1) & Q(replicas__lte=1000),
                name="deployment_replicas_range",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=RequestKind.values), name="deployment_kind_valid"
            ),
            models.CheckConstraint(
                condition=~Q(kind="mig")
                | (~Q(profile="") & Q(memory_mib__isnull=True) & Q(gpu_count__isnull=True)),
                name="deployment_mig_request_shape",
            ),
            models.CheckConstraint(
                condition=~Q(kind="mps")
                | (Q(profile="") & Q(memory_mib__gte=1) & Q(gpu_count__isnull=True)),
                name="deployment_mps_request_shape",
            ),
            models.CheckConstraint(
                condition=Q(max_compute_percent__isnull=True)
                | (Q(kind="mps") & Q(max_compute_percent__gte=1) & Q(max_compute_percent__lte=100)),
                name="deployment_compute_percent_range",
            ),
            models.CheckConstraint(
                condition=~Q(kind="gpu")
                | (Q(profile="") & Q(memory_mib__isnull=True) & Q(gpu_count__gte=1)),
                name="deployment_gpu_request_shape",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class AllocationState(models.TextChoices):
    PENDING = "pending", "Pending (agent not yet applied)"
    ACTIVE = "active", "Active"


class Allocation(TimeStampedModel):
    """One replica bound to capacity: a MIG partition, or a GPU with reserved memory/compute.

    Capacity is counted from allocations (reservations), never from measured use.
    ``gpu_slot`` numbers the GPUs of a multi-GPU replica. The partition is always set: the MIG
    instance, or the whole-GPU partition for MPS and dedicated use.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="allocations")
    replica = models.PositiveSmallIntegerField()
    gpu_slot = models.PositiveSmallIntegerField(default=0)
    kind = models.CharField(max_length=8, choices=RequestKind.choices)
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    partition = models.ForeignKey(Partition, on_delete=models.PROTECT, related_name="allocations")
    memory_mib = models.PositiveIntegerField()
    compute_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    state = models.CharField(
        max_length=16, choices=AllocationState.choices, default=AllocationState.PENDING
    )
    generation = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["deployment_id", "replica", "gpu_slot"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "replica", "gpu_slot"], name="allocation_unique_replica_slot"
            ),
            # A MIG partition or a dedicated GPU serves exactly one replica; MPS shares are
            # summed by the service under a row lock on the GPU.
            models.UniqueConstraint(
                fields=["partition"],
                condition=Q(kind="mig"),
                name="allocation_one_per_mig_partition",
            ),
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(kind="gpu"), name="allocation_one_per_dedicated_gpu"
            ),
            models.CheckConstraint(
                condition=Q(memory_mib__gt=0), name="allocation_memory_positive"
            ),
            models.CheckConstraint(
                condition=Q(compute_percent__isnull=True)
                | (Q(compute_percent__gte=1) & Q(compute_percent__lte=100)),
                name="allocation_compute_percent_range",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=RequestKind.values), name="allocation_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.deployment.name}[{self.replica}] on {self.partition}"
