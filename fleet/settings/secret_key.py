"""The embedded mode's secret keys: generated once per data directory, then read back.

A constant key in the source would let anyone who reads it forge session cookies of any
embedded or demo instance reachable on the network; one random key per data directory does not,
and it survives restarts (sessions stay valid). The same goes for the key that encrypts team
secrets at rest (:func:`embedded_secrets_key`, :mod:`fleet.core.secrets`).
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

KEY_FILE_NAME = "secret_key"
SECRETS_KEY_FILE_NAME = "secrets_key"


def embedded_secret_key(data_dir: Path) -> str:
    """The key in ``data_dir/secret_key``, created (mode 0600) when missing.

    Several processes may start at once (the demo server, tests, ``manage.py`` commands): the key
    is written to a private temporary file and linked into place, so a reader never sees a
    half-written file and the first writer wins.
    """
    path = data_dir / KEY_FILE_NAME
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        _create(path, secrets.token_urlsafe(50))
    key = path.read_text(encoding="utf-8").strip()
    if len(key) < 32:
        raise ImproperlyConfigured(
            f"{path} holds no usable secret key; delete it to generate a new one."
        )
    return key


def new_fernet_key() -> str:
    """A new Fernet key (32 random bytes, URL-safe base64), as ``Fernet.generate_key()``."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")


def fernet_keys(raw: str, name: str = "FLEET_SECRETS_KEY") -> list[str]:
    """The comma-separated Fernet keys of ``raw``, in order (the first encrypts, every one
    decrypts); a key that is not 32 bytes of URL-safe base64 stops the start, named by its
    position only (never its value)."""
    keys = [key.strip() for key in raw.split(",") if key.strip()]
    if not keys:
        raise ImproperlyConfigured(f"{name} holds no key.")
    for position, key in enumerate(keys, start=1):
        try:
            valid = len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32
        except (binascii.Error, ValueError):
            valid = False
        if not valid:
            raise ImproperlyConfigured(
                f"Key {position} of {name} is not a Fernet key (32 bytes of URL-safe base64); "
                "generate one with: python manage.py secrets_key"
            )
    return keys


def embedded_secrets_key(data_dir: Path) -> list[str]:
    """The key that encrypts team secrets in ``data_dir/secrets_key``, created (mode 0600) when
    missing, as :func:`embedded_secret_key` does. Losing the file loses every team secret."""
    path = data_dir / SECRETS_KEY_FILE_NAME
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        _create(path, new_fernet_key())
    return fernet_keys(path.read_text(encoding="utf-8").strip(), str(path))


def _create(path: Path, key: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(key + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process was first: keep its key
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
