"""Workloads (deployments) and their replicas bound to capacity (allocations)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q

from fleet.core.models import Team, TimeStampedModel, default_team_id
from fleet.core.units import format_mib
from fleet.inventory.models import Gpu
from fleet.partitioning.models import Partition
from hostagent.protocol import default_workload


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

    # Its details: fields people read that nothing places, runs or bills by. The API reads and
    # writes them (on create and PATCH) with these fields' own bounds and help text, through
    # fleet.allocations.details; docs/architecture.md, "Adding a field to Deployment".
    DETAIL_FIELDS: ClassVar[tuple[str, ...]] = ("description", "priority")

    name = models.CharField(max_length=200, unique=True)
    description = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="What it is for, in a few words (at most 500 characters); shown under its "
        "name. Every role reads it, as the name.",
    )
    priority = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="Its priority class (`GET /priorities/`): a higher one is served first in the "
        "queue and yields last within its team, never taking another team's deserved share. "
        "Empty: its team's `default_priority`.",
    )
    # Who owns it: its team's operators act on it, its team's quota bounds its replicas.
    # Saved without one, it joins the ``default`` team.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="deployments")
    kind = models.CharField(max_length=8, choices=RequestKind.choices)
    profile = models.CharField(max_length=32, blank=True)
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    max_compute_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    replicas = models.PositiveSmallIntegerField(default=1)
    # Created with ``auto``: the engine places every replica, those added by scaling too.
    auto_place = models.BooleanField(default=False)
    # What each replica runs (``hostagent.protocol.Workload``, every field given); runtime
    # ``none`` runs nothing and an outside launcher reads the allocation's environment.
    workload = models.JSONField(default=default_workload)
    # Labels every host of its replicas must carry (rule placement.host_labels); {}: any host.
    host_labels = models.JSONField(default=dict, blank=True)
    # Host memory each replica's workload may use (its container's or process cgroup's limit);
    # ``None``: the team policy's default (fleet.core.policy).
    host_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    # Deleted, waiting for its replicas' workloads to stop (then the row goes).
    deleting = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                # 0: scaled to zero by its autoscaling policy (fleet.autoscaling).
                condition=Q(replicas__gte=0) & Q(replicas__lte=1000),
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

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.team_id is None:
            self.team_id = default_team_id()
        super().save(*args, **kwargs)


class AllocationState(models.TextChoices):
    PENDING = "pending", "Pending (agent not yet applied)"
    ACTIVE = "active", "Active"
    # Evicted while its workload may still run: the slice stays reserved until the agent says
    # the workload has exited (the desired state no longer lists it, so the agent stops it).
    RELEASING = "releasing", "Releasing (workload stopping)"


class WorkloadState(models.TextChoices):
    """``hostagent.protocol.WorkloadState``, as the agent reports it."""

    NONE = "none", "None"
    PENDING = "pending", "Pending"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    EXITED = "exited", "Exited"
    FAILED = "failed", "Failed"
    CRASHLOOP = "crashloop", "Crash loop"


# A copy in one of these has given up: it does not run, and will not without a new start.
FAILED_STATES = frozenset({WorkloadState.FAILED, WorkloadState.CRASHLOOP, WorkloadState.EXITED})


class AllocationQuerySet(models.QuerySet["Allocation"]):
    def placed(self) -> AllocationQuerySet:
        """The replicas in place (pending or active), not those releasing their slice."""
        return self.exclude(state=AllocationState.RELEASING)

    def releasing(self) -> AllocationQuerySet:
        return self.filter(state=AllocationState.RELEASING)


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
    released_at = models.DateTimeField(null=True, blank=True)
    # The replica's workload as the agent last reported it (``none`` for runtime ``none``).
    workload_state = models.CharField(
        max_length=16, choices=WorkloadState.choices, default=WorkloadState.NONE
    )
    started_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.SmallIntegerField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    workload_message = models.CharField(max_length=256, blank=True)
    # The replica's host port per declared port name (``{"http": 20001}``), as its agent
    # reported them and :func:`hostagent.protocol.report_port_problems` accepted.
    ports = models.JSONField(default=dict, blank=True)
    # A move's new copy of a replica (make before break): it runs beside the copy it replaces
    # until it is running, then that one is released (:mod:`fleet.allocations.moves`).
    # What this copy runs (``hostagent.protocol.Workload``), fixed when it was placed: a rolling
    # update's new copies run the new workload beside the old ones. Null: the deployment's.
    workload = models.JSONField(null=True, blank=True)
    replaces = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="successor"
    )
    # Placed past its team's deserved share, on capacity no other team's deserved share needed
    # then (fleet.allocations.borrowing); a move's new copy keeps its copy's mark.
    borrowed = models.BooleanField(default=False)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        ordering = ["deployment_id", "replica", "gpu_slot"]
        constraints = [
            # A releasing replica's successor may be placed while it stops, and a move's new
            # copy runs beside the one it replaces.
            models.UniqueConstraint(
                fields=["deployment", "replica", "gpu_slot"],
                condition=~Q(state="releasing") & Q(replaces__isnull=True),
                name="allocation_unique_replica_slot",
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


class ReplicaSample(models.Model):
    """One minute of a replica's history: the means of its 1 s points (kept a week; the last
    hour at 1 s lives in the telemetry store, :mod:`fleet.allocations.accounting.telemetry`).
    ``None`` means the agent had no value that minute, never zero."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="samples")
    ts = models.DateTimeField()
    utilization_percent = models.FloatField(null=True, blank=True)
    memory_used_mib = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["allocation_id", "ts"]
        # Retention deletes by age across all replicas.
        indexes = [models.Index(fields=["ts"], name="replica_sample_ts")]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "ts"], name="replica_sample_unique_point")
        ]

    def __str__(self) -> str:
        return f"allocation {self.allocation_id} at {self.ts:%Y-%m-%d %H:%M}"


class UsageInterval(models.Model):
    """How long one allocation row existed: chargeback's record
    (:mod:`fleet.allocations.accounting.usage`).

    Opened when the allocation row is created and closed (``ended_at``) when it is deleted, by
    the ``post_save``/``post_delete`` receivers in :mod:`fleet.allocations.accounting.usage`, so
    cascade and queryset deletes end it too. Names are copied: the history outlives the
    deployment, its team and the allocation (``allocation_id`` is a plain number, no foreign key).
    """

    # One open interval per allocation; a team change closes it and opens the next.
    allocation_id = models.PositiveBigIntegerField(db_index=True)
    deployment_id = models.PositiveBigIntegerField()
    deployment_name = models.CharField(max_length=200)
    team_id = models.PositiveBigIntegerField(null=True)
    team_name = models.CharField(max_length=200, blank=True)
    replica = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=8, choices=RequestKind.choices)
    product_key = models.CharField(max_length=64, blank=True)
    product_name = models.CharField(max_length=128, blank=True)
    gpu_id = models.PositiveBigIntegerField()
    gpu_memory_mib = models.PositiveIntegerField()
    # MIG: the profile, its compute slices and the GPU's (the product's ``compute_slice_count``).
    profile = models.CharField(max_length=32, blank=True)
    compute_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu_compute_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    # MPS: the reserved memory and compute cap (null: uncapped).
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    compute_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    # Whole GPUs: 1 per allocation row (a replica of n GPUs has n rows).
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    # Its allocation was borrowed (past the team's deserved share): usage splits these hours.
    borrowed = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [models.Index(fields=["started_at"], name="usage_interval_started")]
        constraints = [
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="usage_interval_ends_after_start",
            ),
            models.UniqueConstraint(
                fields=["allocation_id"],
                condition=Q(ended_at__isnull=True),
                name="usage_interval_one_open_per_allocation",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_name}[{self.replica}] {self.kind} from {self.started_at}"


def describe_request(deployment: Deployment) -> str:
    """What one replica of the deployment asks for, in words: ``MIG 1g.10gb``,
    ``MPS 2 GiB \u00b7 10% SM``, ``2 whole GPUs`` (the dashboard's cards, the audit trail)."""
    if deployment.kind == RequestKind.MIG:
        return f"MIG {deployment.profile}"
    if deployment.kind == RequestKind.MPS:
        memory = format_mib(deployment.memory_mib or 0)
        cap = f" · {deployment.max_compute_percent}% SM" if deployment.max_compute_percent else ""
        return f"MPS {memory}{cap}"
    count = deployment.gpu_count or 1
    return f"{count} whole GPU{'s' if count != 1 else ''}"
