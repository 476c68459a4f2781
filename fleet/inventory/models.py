"""Observed state: hosts and their GPUs, as the agents report them."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from fleet.core.models import TimeStampedModel


class HostStatus(models.TextChoices):
    """``cordoned``: takes no new replicas (an operator's word); ``draining``: its replicas are
    moving off (a host drain); ``maintenance``: drained, takes nothing until uncordoned."""

    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"
    MAINTENANCE = "maintenance", "Maintenance"
    UNHEALTHY = "unhealthy", "Unhealthy"
    OFFLINE = "offline", "Offline"


# The statuses an operator set: the host takes no new replicas, whatever its agent says.
HELD_STATUSES = (HostStatus.CORDONED, HostStatus.DRAINING, HostStatus.MAINTENANCE)


class AgentRuntime(models.TextChoices):
    """What the host's agent can run (``hello.runtime``): containers and processes, processes
    only, or nothing (reservations only)."""

    DOCKER = "docker", "Docker"
    PROCESS = "process", "Processes"
    NONE = "none", "None"


class Host(TimeStampedModel):
    """One machine running the agent.

    ``desired_generation`` numbers the desired-state document the control plane wants on the
    host; ``applied_generation`` is the last one the agent acknowledged. Both only grow.
    """

    name = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=HostStatus.choices, default=HostStatus.OFFLINE)
    # A small string-to-string map (fleet.inventory.labels bounds it); deployments may require
    # some (Deployment.host_labels, rule placement.host_labels).
    labels = models.JSONField(default=dict, blank=True)
    enrollment_token_hash = models.CharField(max_length=64, blank=True)
    enrollment_expires_at = models.DateTimeField(null=True, blank=True)
    token_prefix = models.CharField(max_length=16, blank=True, db_index=True)
    token_hash = models.CharField(max_length=64, blank=True)
    # Host tokens expire (FLEET_HOST_TOKEN_DAYS) and are renewed over the socket before that;
    # ``None``: a token issued before expiry existed (it expires at its first renewal).
    token_expires_at = models.DateTimeField(null=True, blank=True)
    # The token a renewal replaced, still accepted until the agent has used the new one once
    # (or ``previous_token_expires_at`` passes), so that a renewal lost on the way locks no
    # host out.
    previous_token_hash = models.CharField(max_length=64, blank=True)
    previous_token_expires_at = models.DateTimeField(null=True, blank=True)
    # Whether the agent was started with --allow-process-runtime (``hello.process_runtime``):
    # process workloads are placed only on such hosts.
    process_runtime = models.BooleanField(default=False)
    # Where other machines reach the replicas' published host ports (the agent's --address,
    # ``hello.address``); empty: the agent did not say.
    address = models.CharField(max_length=253, blank=True)
    # Reserved for these teams only (like a Kubernetes taint): empty means every team may use it.
    reserved_for = models.ManyToManyField("core.Team", blank=True, related_name="reserved_hosts")
    agent_version = models.CharField(max_length=64, blank=True)
    # The protocol its agent speaks (``hello.protocol``); 0: it has not said yet. Agents this
    # server does not serve are refused and recorded here too (fleet.agents.versions).
    agent_protocol = models.PositiveIntegerField(default=0)
    driver_version = models.CharField(max_length=64, blank=True)
    nvml_version = models.CharField(max_length=64, blank=True)
    runtime = models.CharField(
        max_length=16, choices=AgentRuntime.choices, default=AgentRuntime.NONE
    )
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # When the host went quiet (set with ``offline``, cleared by the beat once it is back): its
    # replicas keep their places until FLEET_EVICT_OFFLINE_AFTER_SECONDS have passed since
    # (unreachable is not failed: fleet.workflows.offline).
    offline_since = models.DateTimeField(null=True, blank=True)
    desired_generation = models.PositiveBigIntegerField(default=0)
    applied_generation = models.PositiveBigIntegerField(default=0)
    dispatched_generation = models.PositiveBigIntegerField(default=0)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    dispatch_attempts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(applied_generation__lte=F("desired_generation")),
                name="host_applied_not_ahead_of_desired",
            ),
            models.CheckConstraint(
                condition=Q(dispatched_generation__lte=F("desired_generation")),
                name="host_dispatched_not_ahead_of_desired",
            ),
            models.CheckConstraint(
                condition=Q(status__in=HostStatus.values), name="host_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class SharingMode(models.TextChoices):
    DEDICATED = "dedicated", "Dedicated"
    MIG = "mig", "MIG"
    MPS = "mps", "MPS"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"
    LOST = "lost", "Lost"
    UNKNOWN = "unknown", "Unknown"


class HealthCause(models.TextChoices):
    NONE = "", "None"
    XID = "xid", "Xid error"
    ECC = "ecc", "Uncorrectable ECC errors"
    MPS = "mps", "MPS daemon down"
    LOST = "lost", "GPU lost"
    OPERATOR = "operator", "Marked by an operator"


class Gpu(TimeStampedModel):
    """One physical device. ``product_key`` names its entry in the MIG catalog (``fleet.mig``).

    ``reported_placements`` holds the placements per profile id the agent read from NVML; they
    override the catalog for this GPU.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=96, unique=True)
    product_name = models.CharField(max_length=128)
    product_key = models.CharField(max_length=64, blank=True)
    pci_device_id = models.PositiveBigIntegerField(default=0)
    memory_mib = models.PositiveIntegerField()
    mig_capable = models.BooleanField(default=False)
    mig_enabled = models.BooleanField(default=False)
    mode = models.CharField(
        max_length=16, choices=SharingMode.choices, default=SharingMode.DEDICATED
    )
    health = models.CharField(max_length=16, choices=GpuHealth.choices, default=GpuHealth.UNKNOWN)
    health_reason = models.CharField(max_length=255, blank=True)
    health_cause = models.CharField(max_length=16, choices=HealthCause.choices, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    cordoned = models.BooleanField(default=False)
    cordon_reason = models.CharField(max_length=255, blank=True)
    # A cordon the health checks set (and lift on recovery); an operator's cordon is never lifted.
    auto_cordoned = models.BooleanField(default=False)
    reported_placements = models.JSONField(default=dict, blank=True)
    observed = models.JSONField(
        default=dict, blank=True, help_text="The GPU as its agent last described it (hello/ack)."
    )
    last_telemetry = models.JSONField(
        default=dict,
        blank=True,
        help_text="The latest telemetry sample; null means NVML has no value.",
    )
    last_telemetry_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_index_per_host"),
            models.CheckConstraint(condition=Q(memory_mib__gt=0), name="gpu_memory_positive"),
            models.CheckConstraint(
                condition=~Q(mode=SharingMode.MIG) | Q(mig_capable=True),
                name="gpu_mig_mode_needs_mig_capable",
            ),
            models.CheckConstraint(condition=Q(mode__in=SharingMode.values), name="gpu_mode_valid"),
            models.CheckConstraint(
                condition=Q(health__in=GpuHealth.values), name="gpu_health_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host.name}/gpu{self.index} ({self.product_name})"


class TelemetrySample(models.Model):
    """One point of a GPU's history in PostgreSQL: per-minute means (``resolution_s=60``, kept a
    week). The 1 s points of the last hour live in the telemetry store
    (:mod:`fleet.inventory.telemetry`); ``resolution_s=1`` rows are only left from older versions
    and deleted after an hour. ``None`` means NVML had no value, never zero."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    ts = models.DateTimeField()
    resolution_s = models.PositiveSmallIntegerField(default=1)
    utilization_percent = models.FloatField(null=True, blank=True)
    memory_used_mib = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["gpu_id", "resolution_s", "ts"]
        # Retention deletes by (resolution, age) across all GPUs.
        indexes = [models.Index(fields=["resolution_s", "ts"], name="sample_resolution_ts")]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "resolution_s", "ts"], name="sample_unique_point"
            ),
            models.CheckConstraint(
                condition=models.Q(resolution_s__in=[1, 60]), name="sample_resolution_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id}@{self.ts:%H:%M:%S}/{self.resolution_s}s"


class HealthEventKind(models.TextChoices):
    XID = "xid", "Xid"
    ECC = "ecc", "ECC"
    MPS_DOWN = "mps_down", "MPS daemon down"
    MPS_UP = "mps_up", "MPS daemon up"
    GPU_LOST = "gpu_lost", "GPU lost"
    GPU_BACK = "gpu_back", "GPU back"
    HOST_OFFLINE = "host_offline", "Host offline"
    HOST_ONLINE = "host_online", "Host online"
    AGENT_REPLACED = "agent_replaced", "Agent connection replaced"
    CRASHLOOP = "crashloop", "Workload crash loop"
    ORPHAN_STOPPED = "orphan_stopped", "Orphan workload stopped"
    # The agent reported a GPU whose UUID another host holds: ignored (see gpu_forget).
    GPU_CONFLICT = "gpu_conflict", "GPU claimed by another host"


class HealthEvent(models.Model):
    """An event an agent reported (or a heartbeat the control plane missed)."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="events")
    gpu = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    kind = models.CharField(max_length=16, choices=HealthEventKind.choices)
    xid = models.PositiveIntegerField(null=True, blank=True)
    gpu_instance_id = models.PositiveIntegerField(null=True, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    ts = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-ts", "-id"]
        indexes = [
            models.Index(fields=["gpu", "-ts"]),
            models.Index(fields=["host", "-ts"]),
            models.Index(fields=["ts"], name="healthevent_ts"),  # retention deletes by age
        ]

    def __str__(self) -> str:
        return f"{self.kind} on {self.gpu or self.host}"
