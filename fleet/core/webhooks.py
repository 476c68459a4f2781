"""Webhook configuration and delivery: validate, sign (HMAC-SHA256), POST, retry with backoff.

A delivery is claimed with a compare-and-set (``pending``/``retrying`` -> ``sending``), so a
duplicate task or two workers send it once. A failed attempt (a connection error or any answer
but 2xx) is tried again after ``FLEET_ALERT_RETRY_SECONDS`` doubling each time, at most an
hour apart, until ``FLEET_ALERT_MAX_ATTEMPTS``; the beat task ``fleet.retry_alerts`` sends the
due ones, and picks up a send whose worker died (``sending`` for longer than a timeout allows).

Receivers check ``X-Fleet-Signature: sha256=<hex>``, the HMAC-SHA256 with the webhook's secret
of ``<X-Fleet-Timestamp>.<body>`` (the timestamp is signed so an old body cannot be replayed).

The secret and the whole URL (its user name and password, sent as HTTP Basic, its path and its
query: Slack's and Teams' URLs are bearer secrets) are encrypted at rest with the team secrets'
keys (``FLEET_SECRETS_KEYS``, :mod:`fleet.core.secrets`) and never shown again: the API, the
pages and the audit trail see ``scheme://host[:port]/…`` only (:func:`url_shown`).

``FLEET_ALERT_TIMEOUT_SECONDS`` bounds a whole attempt (name lookup, connect, TLS, request and
answer), not each read: a receiver trickling its answer cannot hold a worker
(:mod:`fleet.core.outbound`, which image pinning uses too). A webhook never reaches this
machine, its cloud or its private networks: loopback, link-local (the metadata service
169.254.169.254), private (RFC 1918, IPv6 ULA, shared 100.64/10), unspecified and multicast
addresses (every one that is not globally routable) are refused when the URL is given (an IP
literal, ``localhost``) and again at each send, after DNS, on every address the name resolves
to; the send connects to the address it checked. ``FLEET_WEBHOOK_ALLOW_PRIVATE`` lifts the
refusal, for a receiver on the internal network or on the same machine (an admin's choice:
Kubernetes' admission webhooks and Grafana's alerting make the same one).
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import time
from base64 import b64encode
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from fleet.core.alerts import EVENTS, RESOLVES, SEVERITY
from fleet.core.errors import NotFound, ServiceError
from fleet.core.models import (
    AlertDelivery,
    AlertFormat,
    AlertWebhook,
    DeliveryStatus,
    OperationKind,
    OperationStatus,
)
from fleet.core.operations import operation_record
from fleet.core.outbound import Guard, http_request, names_local_address
from fleet.core.redaction import url_shown
from fleet.core.secrets import secret_decrypt, secret_encrypt

logger = logging.getLogger(__name__)

MAX_URL_CHARS = 2000
MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 256
MAX_WEBHOOKS = 50
MAX_BACKOFF_S = 3600.0
MAX_ANSWER_BYTES = 1024  # of a receiver's body: read (so the answer is whole), never kept
USER_AGENT = "fleet-alerts/1"

# ---- configuration ---------------------------------------------------------------------


def _invalid(field: str, message: str) -> ServiceError:
    return ServiceError("webhook.invalid", message, {"field": field})


def _clean(data: dict[str, Any], *, partial: bool) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    if "url" in data or not partial:
        url = data.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if (
            parts is None
            or len(url) > MAX_URL_CHARS  # type: ignore[arg-type]
            or parts.scheme not in ("http", "https")
            or not parts.hostname
        ):
            raise _invalid("url", f"An http:// or https:// URL of at most {MAX_URL_CHARS} chars.")
        if names_local_address(parts.hostname) and not settings.FLEET_WEBHOOK_ALLOW_PRIVATE:
            raise _invalid(
                "url",
                "A private, loopback, link-local (cloud metadata), unspecified or multicast "
                "address cannot receive webhooks unless an admin sets "
                "FLEET_WEBHOOK_ALLOW_PRIVATE.",
            )
        clean["url"] = url
    if "events" in data or not partial:
        events = data.get("events")
        if (
            not isinstance(events, list)
            or not events
            or any(e not in EVENTS for e in events)
            or len(set(events)) != len(events)
        ):
            raise _invalid("events", f"A non-empty list of distinct events among {list(EVENTS)}.")
        clean["events"] = events
    if "secret" in data or not partial:
        secret = data.get("secret")
        if not isinstance(secret, str) or not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
            raise _invalid(
                "secret", f"A secret of {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters."
            )
        clean["secret"] = secret
    if "format" in data:
        if data["format"] not in AlertFormat.values:
            raise _invalid("format", f"One of {AlertFormat.values}.")
        clean["format"] = data["format"]
    if "enabled" in data:
        if not isinstance(data["enabled"], bool):
            raise _invalid("enabled", "true or false.")
        clean["enabled"] = data["enabled"]
    return clean


def _audit(webhook: AlertWebhook, verb: str, user: Any) -> None:
    operation_record(
        kind=OperationKind.SET_WEBHOOK,
        summary=f"Alert webhook #{webhook.pk} {verb}: {webhook.url}",
        requested_by=user,
        status=OperationStatus.SUCCEEDED,
        payload={"webhook": webhook.pk, "events": webhook.events, "format": webhook.format},
    )


def _stored(clean: dict[str, Any]) -> dict[str, Any]:
    """The row's fields for cleaned input: the URL and the secret encrypted, the URL's shown
    part in the clear."""
    fields = {k: v for k, v in clean.items() if k not in ("url", "secret")}
    if "url" in clean:
        fields.update(url=url_shown(clean["url"]), url_ciphertext=secret_encrypt(clean["url"]))
    if "secret" in clean:
        fields["secret_ciphertext"] = secret_encrypt(clean["secret"])
    return fields


def webhook_url(webhook: AlertWebhook) -> str | None:
    """The webhook's whole URL, decrypted (``None``: no key in ``FLEET_SECRETS_KEYS`` opens
    it)."""
    return secret_decrypt(webhook.url_ciphertext)


def webhook_secret(webhook: AlertWebhook) -> str | None:
    """The webhook's signing secret, decrypted (``None``: no key opens it)."""
    return secret_decrypt(webhook.secret_ciphertext)


def webhook_create(*, data: dict[str, Any], user: Any = None) -> AlertWebhook:
    """A new webhook from API input (``webhook.invalid`` names the field at fault)."""
    clean = _clean(data, partial=False)
    if AlertWebhook.objects.count() >= MAX_WEBHOOKS:
        raise ServiceError("webhook.limit", f"At most {MAX_WEBHOOKS} webhooks.", status_code=409)
    webhook = AlertWebhook.objects.create(
        **_stored(clean), created_by=user if getattr(user, "is_authenticated", False) else None
    )
    _audit(webhook, "created", user)
    return webhook


def webhook_update(*, webhook_id: int, data: dict[str, Any], user: Any = None) -> AlertWebhook:
    """Change the given fields (the URL and the secret too, when given)."""
    webhook = _get(webhook_id)
    for name, value in _stored(_clean(data, partial=True)).items():
        setattr(webhook, name, value)
    webhook.save()
    _audit(webhook, "changed", user)
    return webhook


def webhook_delete(*, webhook_id: int, user: Any = None) -> None:
    webhook = _get(webhook_id)
    _audit(webhook, "deleted", user)
    webhook.delete()


def _get(webhook_id: int) -> AlertWebhook:
    webhook = AlertWebhook.objects.filter(pk=webhook_id).first()
    if webhook is None:
        raise NotFound("webhook.not_found", f"Webhook {webhook_id} does not exist.")
    return webhook


# ---- bodies and signatures ---------------------------------------------------------------

ALERT_NAMES = {
    "gpu.unhealthy": "FleetGpuUnhealthy",
    "host.offline": "FleetHostOffline",
    "hosts.mass_offline": "FleetHostsMassOffline",
    "agent.unsupported": "FleetAgentUnsupported",
    "operation.failed": "FleetOperationFailed",
    "operation.expired": "FleetOperationExpired",
    "replica.crashloop": "FleetReplicaCrashloop",
    "quota.warning": "FleetQuotaWarning",
    "quota.exceeded": "FleetQuotaExceeded",
    "reclaim.started": "FleetReclaimStarted",
    "reclaim.finished": "FleetReclaimFinished",
}


def alertmanager_body(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The event as Alertmanager's ``POST /api/v2/alerts`` takes it (a list of one alert).

    A recovery carries the labels of the alert it ends and ``endsAt``: Alertmanager resolves
    it. The labels are the alert's identity (what it is about), never its changing details.
    """
    event = str(payload["event"])
    labels = {
        "alertname": ALERT_NAMES[RESOLVES.get(event, event)],
        "severity": str(payload["severity"]),
        "source": "fleet",
    }
    annotations = {"summary": str(payload["summary"]), "fleet_event": event}
    for key, value in sorted((payload.get("subject") or {}).items()):
        if key == "operation" and isinstance(value, dict):
            labels["operation"] = str(value.get("id"))
        elif isinstance(value, dict):
            name = value.get("name") or value.get("uuid") or value.get("id")
            if name is not None:
                labels[key] = str(name)
        elif value is not None:
            annotations[key] = str(value)  # details, not identity: the labels must not change
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": annotations,
        "startsAt": payload["ts"],
    }
    if payload.get("state") == "resolved":
        alert["endsAt"] = payload["ts"]
        labels["severity"] = SEVERITY[RESOLVES[event]] if event in RESOLVES else labels["severity"]
    return [alert]


def render_body(webhook_format: str, payload: dict[str, Any]) -> bytes:
    body: Any = (
        alertmanager_body(payload) if webhook_format == AlertFormat.ALERTMANAGER else payload
    )
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8")


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of ``<timestamp>.<body>`` keyed with the webhook's secret."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, "sha256")
    return "sha256=" + mac.hexdigest()


# ---- sending ---------------------------------------------------------------------------


def _guard() -> Guard:
    return Guard(
        allow_private=bool(settings.FLEET_WEBHOOK_ALLOW_PRIVATE),
        purpose="receive webhooks",
        allow_setting="FLEET_WEBHOOK_ALLOW_PRIVATE",
        timeout_setting="FLEET_ALERT_TIMEOUT_SECONDS",
    )


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST the body and return the answer's status, all within FLEET_ALERT_TIMEOUT_SECONDS
    (:func:`fleet.core.outbound.http_request`: no local receiver unless allowed, the checked
    address connected to). A redirect is an answer, not a new destination: it counts as a
    failed attempt."""
    deadline = time.monotonic() + float(settings.FLEET_ALERT_TIMEOUT_SECONDS)
    answer = http_request(
        "POST",
        url,
        headers={**_basic_auth(url), **headers},
        body=body,
        deadline=deadline,
        guard=_guard(),
        max_body=MAX_ANSWER_BYTES,
    )
    return answer.status


def _basic_auth(url: str) -> dict[str, str]:
    """``Authorization: Basic`` from the URL's user name and password, as curl sends them."""
    parts = urlsplit(url)
    if parts.username is None:
        return {}
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return {"Authorization": "Basic " + b64encode(pair.encode("utf-8")).decode("ascii")}


def backoff_seconds(attempts: int) -> float:
    """After ``attempts`` failed attempts: the base delay, doubling, at most an hour."""
    base = float(settings.FLEET_ALERT_RETRY_SECONDS)
    return float(min(base * 2 ** max(attempts - 1, 0), MAX_BACKOFF_S))


def alert_deliver(*, delivery_id: int, now: datetime | None = None) -> str | None:
    """One attempt at one delivery; returns its status after, or ``None`` if it was not due
    (delivered, given up, or being sent by someone else)."""
    now = now or timezone.now()
    claimed = AlertDelivery.objects.filter(
        pk=delivery_id, status__in=[DeliveryStatus.PENDING, DeliveryStatus.RETRYING]
    ).update(
        status=DeliveryStatus.SENDING,
        attempts=F("attempts") + 1,
        last_attempt_at=now,
        next_attempt_at=None,
        updated_at=now,
    )
    if not claimed:
        return None
    delivery = AlertDelivery.objects.select_related("webhook").get(pk=delivery_id)
    webhook = delivery.webhook
    url, secret = webhook_url(webhook), webhook_secret(webhook)
    if url is None or secret is None:
        error = "no key in FLEET_SECRETS_KEYS opens the webhook's URL or secret: set them again"
        return _record(delivery, code=None, error=error, now=now)
    body = render_body(webhook.format, delivery.payload)
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Fleet-Event": delivery.event,
        "X-Fleet-Delivery": str(delivery.pk),
        "X-Fleet-Timestamp": timestamp,
        "X-Fleet-Signature": signature(secret, timestamp, body),
    }
    code: int | None = None
    error = ""
    try:
        code = _post(url, body, headers)
        if not 200 <= code < 300:
            error = f"HTTP {code}"
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timed out, garbled
        error = f"{type(exc).__name__}: {exc}"
    return _record(delivery, code=code, error=error, now=now)


def _record(delivery: AlertDelivery, *, code: int | None, error: str, now: datetime) -> str:
    fields: dict[str, Any] = {"response_code": code, "last_error": error[:500], "updated_at": now}
    if not error:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=timezone.now())
    elif delivery.attempts >= int(settings.FLEET_ALERT_MAX_ATTEMPTS):
        fields.update(status=DeliveryStatus.FAILED)
        logger.warning(
            "alert %s to webhook %s given up after %s attempts: %s",
            delivery.event,
            delivery.webhook_id,
            delivery.attempts,
            error,
        )
    else:
        wait = timedelta(seconds=backoff_seconds(delivery.attempts))
        fields.update(status=DeliveryStatus.RETRYING, next_attempt_at=now + wait)
    AlertDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.SENDING).update(**fields)
    return str(fields["status"])


def alert_deliveries_due(now: datetime | None = None, *, limit: int = 200) -> list[int]:
    """Deliveries to try now: retries whose time has come, and sends a dead worker left
    (``sending`` for longer than a timeout allows: put back to ``retrying`` first)."""
    now = now or timezone.now()
    stuck_before = now - timedelta(seconds=float(settings.FLEET_ALERT_TIMEOUT_SECONDS) * 2 + 60)
    AlertDelivery.objects.filter(
        status=DeliveryStatus.SENDING, last_attempt_at__lt=stuck_before
    ).update(status=DeliveryStatus.RETRYING, next_attempt_at=now, updated_at=now)
    due = AlertDelivery.objects.filter(
        Q(status=DeliveryStatus.RETRYING, next_attempt_at__lte=now)
        | Q(status=DeliveryStatus.PENDING, created_at__lte=now - timedelta(seconds=60))
    )
    return list(due.order_by("next_attempt_at", "pk").values_list("pk", flat=True)[:limit])


def alert_deliveries_prune(now: datetime | None = None) -> int:
    """Forget finished deliveries older than ``FLEET_ALERT_DELIVERIES_KEEP_DAYS``."""
    now = now or timezone.now()
    keep = timedelta(days=int(settings.FLEET_ALERT_DELIVERIES_KEEP_DAYS))
    deleted, _ = AlertDelivery.objects.filter(
        status__in=[DeliveryStatus.DELIVERED, DeliveryStatus.FAILED], created_at__lt=now - keep
    ).delete()
    return deleted
