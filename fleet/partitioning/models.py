"""Desired state: partitions (MIG instances, or the whole GPU) with their MPS policy."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.core.models import TimeStampedModel
from fleet.inventory.models import Gpu


class PartitionKind(models.TextChoices):
    MIG = "mig", "MIG instance"
    GPU = "gpu", "Whole GPU"


class Partition(TimeStampedModel):
    """One unit of capacity a workload can be placed on.

    A MIG GPU instance (NVML profile id + placement ``start:size`` in memory slices), or the GPU
    itself when it is shared through MPS or dedicated to one workload. ``mps_enabled`` runs an
    MPS control daemon on the partition (a whole GPU in MPS mode, or MPS inside a MIG instance).
    ``uuid`` is the observed MIG device UUID once the agent has created it.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="partitions")
    kind = models.CharField(max_length=8, choices=PartitionKind.choices)
    profile_id = models.PositiveSmallIntegerField(null=True, blank=True)
    profile_name = models.CharField(max_length=32, blank=True)
    start = models.PositiveSmallIntegerField(default=0)
    size = models.PositiveSmallIntegerField(default=0)
    compute_slices = models.PositiveSmallIntegerField(default=0)
    memory_mib = models.PositiveIntegerField()
    mps_enabled = models.BooleanField(default=False)
    mps_default_active_thread_percentage = models.PositiveSmallIntegerField(default=100)
    mps_default_pinned_mem_limit_mib = models.PositiveIntegerField(null=True, blank=True)
    mps_max_clients = models.PositiveSmallIntegerField(null=True, blank=True)
    uuid = models.CharField(max_length=96, blank=True)

    class Meta:
        ordering = ["gpu_id", "kind", "start"]
        constraints = [
            # One MIG instance per start slice; overlap across starts is checked by fleet.mig
            # under a row lock on the GPU (SQL cannot state interval overlap portably).
            models.UniqueConstraint(
                fields=["gpu", "start"], condition=Q(kind="mig"), name="partition_unique_mig_start"
            ),
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(kind="gpu"), name="partition_one_whole_gpu"
            ),
            models.CheckConstraint(
                condition=Q(kind="gpu") | (Q(profile_id__isnull=False) & Q(size__gt=0)),
                name="partition_mig_has_profile_and_size",
            ),
            models.CheckConstraint(condition=Q(memory_mib__gt=0), name="partition_memory_positive"),
            models.CheckConstraint(
                condition=Q(mps_default_active_thread_percentage__gte=1)
                & Q(mps_default_active_thread_percentage__lte=100),
                name="partition_mps_thread_percentage_range",
            ),
            models.CheckConstraint(
                condition=Q(mps_max_clients__isnull=True)
                | (Q(mps_max_clients__gte=1) & Q(mps_max_clients__lte=48)),
                name="partition_mps_max_clients_range",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=PartitionKind.values), name="partition_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        if self.kind == PartitionKind.MIG:
            return f"{self.profile_name}@{self.start}:{self.size} on {self.gpu}"
        return f"whole {self.gpu}"
