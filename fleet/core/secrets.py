"""Team secrets: their encryption at rest (webhook credentials use it too), the references to
them in a workload's ``env``, and the env digests that stand for values in the audit trail.

A secret is a :class:`~fleet.core.models.TeamSecret` row whose ``ciphertext`` is a Fernet token
(AES-128-CBC and HMAC-SHA256) under ``FLEET_SECRETS_KEYS``: the first key encrypts, every key
decrypts, so a key is rotated by putting a new one first, re-encrypting
(``manage.py secrets_key --rotate``) and then dropping the old one. A workload refers to a
secret by name (``"env": {"HF_TOKEN": {"secret": "hf-token"}}``); the reference is what the
deployment stores and every read shows, and only the desired state of a host that runs one of
the team's replicas carries the value (:mod:`fleet.agents.documents`). The writes, which must
know the deployments that refer to a secret, live in :mod:`fleet.allocations.secrets`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import transaction

from fleet.core.errors import RuleViolation, ServiceError
from fleet.core.models import AlertWebhook, Team, TeamSecret
from fleet.domain import Violation
from hostagent import protocol

logger = logging.getLogger(__name__)

MAX_VALUE_CHARS = protocol.MAX_ARG_CHARS
"""The longest value a secret holds: an env value of the agent protocol (4096 characters), or
the host's whole desired state would be refused by its agent."""
MAX_SECRETS_PER_TEAM = 256
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
NAME_RULE = "1 to 100 letters, digits, '-' or '_', starting with a letter or a digit"
DIGEST_CHARS = 12


# --------------------------------------------------------------------------------------------
# Encryption at rest
# --------------------------------------------------------------------------------------------


@functools.cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def secrets_cipher() -> MultiFernet:
    """The cipher of ``FLEET_SECRETS_KEYS`` (read each call: tests override the setting)."""
    return _fernet(tuple(settings.FLEET_SECRETS_KEYS))


def secret_encrypt(value: str) -> str:
    """``value`` encrypted with the first key, as a Fernet token (ASCII)."""
    return secrets_cipher().encrypt(value.encode("utf-8")).decode("ascii")


def secret_decrypt(ciphertext: str) -> str | None:
    """The value of a Fernet token, or ``None`` when no key in ``FLEET_SECRETS_KEYS`` opens it
    (a key dropped too early, or a row edited by hand)."""
    try:
        return secrets_cipher().decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError):
        return None


def _rotated(cipher: MultiFernet, ciphertext: str) -> str | None:
    try:
        return cipher.rotate(ciphertext.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError):
        return None


@transaction.atomic
def secrets_reencrypt() -> tuple[int, int]:
    """Re-encrypt every team secret, and every webhook's URL and signing secret, with the first
    key (after a new key was put first); returns (re-encrypted, unreadable). An unreadable one
    is left as it is and logged by name."""
    cipher = secrets_cipher()
    done = unreadable = 0
    for secret in TeamSecret.objects.select_for_update().order_by("pk"):
        token = _rotated(cipher, secret.ciphertext)
        if token is None:
            logger.warning("secret %s of team %s: no key opens it", secret.name, secret.team_id)
            unreadable += 1
            continue
        TeamSecret.objects.filter(pk=secret.pk).update(ciphertext=token)
        done += 1
    for webhook in AlertWebhook.objects.select_for_update().order_by("pk"):
        url = _rotated(cipher, webhook.url_ciphertext)
        secret_token = _rotated(cipher, webhook.secret_ciphertext)
        if url is None or secret_token is None:
            logger.warning("webhook #%s: no key opens its URL or its secret", webhook.pk)
            unreadable += 1
            continue
        AlertWebhook.objects.filter(pk=webhook.pk).update(
            url_ciphertext=url, secret_ciphertext=secret_token
        )
        done += 1
    return done, unreadable


# --------------------------------------------------------------------------------------------
# Names and values
# --------------------------------------------------------------------------------------------


def secret_name_checked(name: Any) -> str:
    """``name`` when it is a valid secret name; else 400 ``secret.name_invalid``."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ServiceError(
            "secret.name_invalid", f"A secret's name is {NAME_RULE}.", {"field": "name"}
        )
    return name


def secret_value_checked(value: Any) -> str:
    """``value`` when it is a string of 1 to :data:`MAX_VALUE_CHARS` characters, valid UTF-8,
    without NUL (an env value cannot hold one); else 400 ``secret.value_invalid``. The message
    never repeats the value."""
    problem = None
    if not isinstance(value, str):
        problem = "A secret's value is a string."
    elif not value:
        problem = "A secret's value is not empty."
    elif "\x00" in value:
        problem = "A secret's value holds no NUL character."
    elif len(value) > MAX_VALUE_CHARS:
        problem = f"A secret's value is {MAX_VALUE_CHARS} characters at most."
    else:
        try:
            value.encode("utf-8")
        except UnicodeError:
            problem = "A secret's value is valid UTF-8."
    if problem is not None:
        raise ServiceError("secret.value_invalid", problem, {"field": "value"})
    assert isinstance(value, str)
    return value


# --------------------------------------------------------------------------------------------
# References in a workload's env
# --------------------------------------------------------------------------------------------


def secret_ref(value: Any) -> str | None:
    """The secret's name when ``value`` is a reference ``{"secret": name}``, else ``None``."""
    if isinstance(value, Mapping) and set(value) == {"secret"}:
        name = value["secret"]
        return name if isinstance(name, str) else None
    return None


def env_refs(env: Any) -> dict[str, str]:
    """``{variable: secret name}`` of the references in ``env`` (anything else: ``{}``)."""
    if not isinstance(env, Mapping):
        return {}
    return {key: name for key, value in env.items() if (name := secret_ref(value)) is not None}


def workload_refs(workload: Any) -> dict[str, str]:
    """``{variable: secret name}`` of a stored or given workload's references."""
    return env_refs(workload.get("env")) if isinstance(workload, Mapping) else {}


def env_ref_problems(env: Any) -> list[tuple[str, str]]:
    """``(field, message)`` for each env value that is neither a string nor a well-formed
    reference (an object whose only key is ``secret``, a valid secret name)."""
    if not isinstance(env, Mapping):
        return []
    problems = []
    for key, value in env.items():
        if isinstance(value, str):
            continue
        name = secret_ref(value)
        if name is None or not NAME_PATTERN.match(name):
            problems.append(
                (
                    f"env.{str(key)[:64]}",
                    'An env value is a string or {"secret": "<name>"} naming one of the '
                    f"team's secrets ({NAME_RULE}).",
                )
            )
    return problems


def value_digest(value: str) -> str:
    """A short digest of an env value: tells two values apart in the audit trail without
    keeping either (``sha256:`` and the first 12 hex digits)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:DIGEST_CHARS]


def workload_digested(workload: Mapping[str, Any]) -> dict[str, Any]:
    """``workload`` for an operation's payload: each plain env value replaced by its digest
    (:func:`value_digest`), references kept (they hold no value)."""
    env = workload.get("env")
    if not isinstance(env, Mapping):
        return dict(workload)
    return {
        **workload,
        "env": {
            key: value_digest(value) if isinstance(value, str) else value
            for key, value in env.items()
        },
    }


# --------------------------------------------------------------------------------------------
# Reads
# --------------------------------------------------------------------------------------------


def team_secret_values(team_id: int, names: Iterable[str]) -> dict[str, str]:
    """``{name: value}`` of the team's secrets among ``names`` (decrypted); a missing or
    unreadable one is left out (logged by name)."""
    wanted = set(names)
    if not wanted:
        return {}
    values = {}
    rows = TeamSecret.objects.filter(team_id=team_id, name__in=wanted)
    for name, ciphertext in rows.values_list("name", "ciphertext"):
        value = secret_decrypt(ciphertext)
        if value is None:
            logger.warning(
                "secret %s of team %s: no key in FLEET_SECRETS_KEYS opens it", name, team_id
            )
        else:
            values[name] = value
    return values


def secrets_enforce(*, team: Team, workload: Mapping[str, Any]) -> None:
    """Refuse (422 ``secret.not_found``, one violation per missing name) a workload that refers
    to a secret its team does not have: a deployment reads its own team's secrets only."""
    refs = workload_refs(workload)
    if not refs:
        return
    # Locked: a secret being deleted waits for this write, then sees its reference.
    held = TeamSecret.objects.select_for_update().filter(team_id=team.pk, name__in=refs.values())
    missing = sorted(set(refs.values()) - set(held.values_list("name", flat=True)))
    if not missing:
        return
    violations = [
        Violation(
            "secret.not_found",
            f"Team {team.name} has no secret {name!r} (POST /api/v1/teams/{team.pk}/secrets).",
            {"secret": name, "env": sorted(k for k, v in refs.items() if v == name)},
        )
        for name in missing
    ]
    raise RuleViolation(violations[0].message, violations, team=team.pk)


def secret_as_dict(secret: TeamSecret) -> dict[str, Any]:
    """What the API shows of a secret: never its value."""
    return {
        "name": secret.name,
        "version": secret.version,
        "updated_by": secret.updated_by.get_username() if secret.updated_by else None,
        "created_at": secret.created_at.isoformat(),
        "updated_at": secret.updated_at.isoformat(),
    }
