"""Shared model bases, the audit trail (operations), user API tokens and failed logins."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet.core.priority_models import PriorityClass as PriorityClass  # Django finds it here


class TimeStampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class ApiToken(models.Model):
    """A user's API token for scripts (``Authorization: Token <key>``); only its hash is kept."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    # Display only: lookups go by the unique hash (rows issued before the prefix fix hold "").
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Refused from this time on; empty: never expires."
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk}, {self.prefix or '?'}…)"

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())


class LoginFailure(models.Model):
    """One failed sign-in on ``/login/`` or ``/admin/login/``, kept for the admins to see
    (pruned after ``FLEET_LOGIN_FAILURES_KEEP_DAYS``)."""

    username = models.CharField(max_length=150, blank=True)
    address = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.username!r} from {self.address or '?'} at {self.at:%Y-%m-%d %H:%M:%S}"


DEFAULT_TEAM_SLUG = "default"


class Team(TimeStampedModel):
    """A group of users owning deployments, with a quota on what their replicas hold.

    A quota limit left empty (``None``) does not bound that kind of capacity; ``mig_profiles``
    bounds the replicas of each listed profile (``{"1g.10gb": 8}``) and leaves others free.
    """

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    quota_gpus = models.PositiveIntegerField(null=True, blank=True)
    quota_mig_compute_slices = models.PositiveIntegerField(null=True, blank=True)
    quota_mps_memory_mib = models.PositiveBigIntegerField(null=True, blank=True)
    quota_mig_profiles = models.JSONField(default=dict, blank=True)
    # The quota above is the deserved share; the limit bounds all it may hold, borrowing
    # included (fleet.placement.sharing, docs/sharing.md).
    limit_gpus = models.PositiveIntegerField(null=True, blank=True)
    limit_mig_compute_slices = models.PositiveIntegerField(null=True, blank=True)
    limit_mps_memory_mib = models.PositiveBigIntegerField(null=True, blank=True)
    limit_mig_profiles = models.JSONField(default=dict, blank=True)
    # The weight divides its use in the queue; the class its deployments naming none take.
    over_quota_weight = models.PositiveIntegerField(default=1)
    default_priority = models.CharField(max_length=32, blank=True, default="")
    # What the team's workloads may do on a host (runtimes, images, users, capabilities, limits,
    # host network), set by admins only; ``{}`` is the restricted default. The rules and their
    # defaults live in fleet.core.policy.
    policy = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_quota(self) -> bool:
        limits = (self.quota_gpus, self.quota_mig_compute_slices, self.quota_mps_memory_mib)
        return any(limit is not None for limit in limits) or bool(self.quota_mig_profiles)

    @property
    def has_limit(self) -> bool:
        limits = (self.limit_gpus, self.limit_mig_compute_slices, self.limit_mps_memory_mib)
        return any(limit is not None for limit in limits) or bool(self.limit_mig_profiles)

    @property
    def shares_bounded(self) -> bool:  # a deserved share or a limit: its places lock its row
        return self.has_quota or self.has_limit


def default_team_id() -> int:
    """The ``default`` team's id (created on first use): deployments made without a team."""
    team, _ = Team.objects.get_or_create(
        slug=DEFAULT_TEAM_SLUG, defaults={"name": DEFAULT_TEAM_SLUG}
    )
    return team.pk


class TeamRole(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"


class TeamMembership(models.Model):
    """A user's role in one team: ``viewer`` reads, ``operator`` acts on the team's
    deployments (create, place, move, scale, delete)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    role = models.CharField(max_length=16, choices=TeamRole.choices, default=TeamRole.VIEWER)

    class Meta:
        ordering = ["team_id", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="team_membership_unique"),
            models.CheckConstraint(
                condition=Q(role__in=TeamRole.values), name="team_membership_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class TeamSecret(TimeStampedModel):
    """A named secret of one team, encrypted at rest (fleet.core.secrets): a workload refers to
    it by name (``"env": {"HF_TOKEN": {"secret": "hf-token"}}``) and only the agents running the
    team's replicas receive its value. ``version`` grows with each new value."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="secrets")
    name = models.SlugField(max_length=100)
    ciphertext = models.TextField()
    version = models.PositiveIntegerField(default=1)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="team_secret_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.team}/{self.name} (v{self.version})"


class OperationKind(models.TextChoices):
    SET_LAYOUT = "set_layout", "Set layout"
    PLACE = "place", "Place"
    EVICT = "evict", "Evict"
    CREATE_DEPLOYMENT = "create_deployment", "Create deployment"
    DELETE_DEPLOYMENT = "delete_deployment", "Delete deployment"
    CORDON = "cordon", "Cordon"
    UNCORDON = "uncordon", "Uncordon"
    CREATE_HOST = "create_host", "Create host"
    ENROLL_HOST = "enroll_host", "Enroll host"
    HEALTH = "health", "Health change"
    REPLACE = "replace", "Re-place replica"
    DRAIN = "drain", "Drain and reshape"
    EVICT_HOST = "evict_host", "Re-place an offline host's replicas"
    MASS_OFFLINE = "mass_offline", "Mass offline"
    MOVE = "move", "Move replica"
    SCALE = "scale", "Scale deployment"
    DEPLOYMENT_ROLLOUT = "rollout", "Rolling update"
    DEFRAG = "defrag", "Defragment"
    LAYOUT_ROLLOUT = "layout_rollout", "Layout rollout"
    CORDON_HOST = "cordon_host", "Cordon host"
    UNCORDON_HOST = "uncordon_host", "Uncordon host"
    DRAIN_HOST = "drain_host", "Drain host"
    SET_LABELS = "set_labels", "Set host labels"
    CREATE_TOKEN = "create_token", "Create API token"
    REVOKE_TOKEN = "revoke_token", "Revoke API token"
    CHANGE_USER = "change_user", "Change user"
    ADMIN_CHANGE = "admin_change", "Change in the Django admin"
    SET_WEBHOOK = "set_webhook", "Set alert webhook"
    TEAM = "team", "Team change"
    SET_QUOTA = "set_quota", "Set team quota"
    OVER_QUOTA = "over_quota", "Over quota"
    REPACK = "repack", "Repack GPUs"
    FORGET_GPU = "forget_gpu", "Forget GPU"
    SET_POLICY = "set_policy", "Set team policy"
    SET_SECRET = "set_secret", "Set team secret"
    DELETE_SECRET = "delete_secret", "Delete team secret"
    RESERVE_HOST = "reserve_host", "Reserve host"
    ROTATE_HOST_TOKEN = "rotate_host_token", "Rotate host token"
    SET_ENDPOINT = "set_endpoint", "Set deployment endpoint"
    SET_AUTOSCALING = "set_autoscaling", "Set deployment autoscaling"
    AUTOSCALE = "autoscale", "Autoscale"
    RECLAIM = "reclaim", "Reclaim a deserved share"


class OperationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DISPATCHED = "dispatched", "Dispatched"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"


FINAL_STATUSES = (OperationStatus.SUCCEEDED, OperationStatus.FAILED, OperationStatus.EXPIRED)


class Operation(TimeStampedModel):
    """One change, from request to outcome: the audit trail (who, what, when, status, reason).

    Changes that an agent must realise carry the host's desired ``generation``; they complete
    when the agent acknowledges that generation (or a later one).
    """

    kind = models.CharField(max_length=32, choices=OperationKind.choices)
    status = models.CharField(
        max_length=16, choices=OperationStatus.choices, default=OperationStatus.PENDING
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Who asked, as their username then: the audit keeps its actor when the user is deleted
    # (``requested_by`` then becomes NULL). Empty: the system (beat, agents, Fleet itself).
    requested_by_name = models.CharField(max_length=150, blank=True, db_index=True)
    host = models.ForeignKey(
        "inventory.Host",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="operations",
    )
    gpu = models.ForeignKey(
        "inventory.Gpu", null=True, blank=True, on_delete=models.SET_NULL, related_name="operations"
    )
    deployment = models.ForeignKey(
        "allocations.Deployment",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="operations",
    )
    # The long-running operation this one is a step of (a defrag's move, a rollout's drain):
    # its ending wakes the parent (fleet.workflows.engine).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    generation = models.PositiveBigIntegerField(null=True, blank=True)
    summary = models.CharField(max_length=255)
    payload = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Born in the partitioning app; the table kept its name when the audit moved to core.
        db_table = "partitioning_operation"
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "host"]),
            models.Index(fields=["-created_at"]),
            # The last operation of a kind (the mass-offline guard reads it every beat run).
            models.Index(fields=["kind", "-created_at"], name="operation_kind_created"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=OperationStatus.values), name="operation_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True) | Q(status__in=FINAL_STATUSES),
                name="operation_finished_only_when_final",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.requested_by_name and self.requested_by_id is not None:
            self.requested_by_name = self.requested_by.get_username()  # type: ignore[union-attr]
        super().save(*args, **kwargs)


class AlertFormat(models.TextChoices):
    FLEET = "fleet", "Fleet JSON"
    ALERTMANAGER = "alertmanager", "Alertmanager (POST /api/v2/alerts)"


class AlertWebhook(TimeStampedModel):
    """Where alerts go: an http(s) URL, the events it wants, and the secret that signs each body
    (HMAC-SHA256). The URL (credentials, path and query included) and the secret are encrypted
    at rest like team secrets (``url_ciphertext``, ``secret_ciphertext``: Fernet tokens under
    ``FLEET_SECRETS_KEYS``, :mod:`fleet.core.webhooks`); ``url`` is what may be shown of the
    URL, its scheme, host and port."""

    url = models.URLField(max_length=2000)
    url_ciphertext = models.TextField(default="")
    events = models.JSONField(default=list)
    secret_ciphertext = models.TextField(default="")
    format = models.CharField(max_length=16, choices=AlertFormat.choices, default="fleet")
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook #{self.pk} → {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    RETRYING = "retrying", "Retrying"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class AlertDelivery(TimeStampedModel):
    """One alert event on its way to one webhook: the delivery log (attempts, last answer)."""

    webhook = models.ForeignKey(AlertWebhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The retry sweep: due deliveries by status and time.
            models.Index(fields=["status", "next_attempt_at"], name="delivery_due"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} → webhook #{self.webhook_id} ({self.status})"


class SsoSource(models.TextChoices):
    OIDC = "oidc", "OIDC"
    LDAP = "ldap", "LDAP"


class SsoIdentity(models.Model):
    """The identity-provider account a user signs in with (``fleet.core.sso``): the groups
    last seen, and when the directory last said the account exists and may sign in."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    source = models.CharField(max_length=8, choices=SsoSource.choices)
    subject = models.CharField(max_length=255)  # OIDC ``sub``; the LDAP user name
    groups = models.JSONField(default=list, blank=True)
    synced_at = models.DateTimeField(default=timezone.now)
    disabled_at = models.DateTimeField(null=True, blank=True)  # by the sync, not by an admin

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "subject"], name="sso_identity_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.subject}"
