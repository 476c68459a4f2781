"""The embedded mode's secret key: generated once per data directory, then read back.

A constant key in the source would let anyone who reads it forge session cookies of any
embedded or demo instance reachable on the network; one random key per data directory does not,
and it survives restarts (sessions stay valid).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

KEY_FILE_NAME = "secret_key"


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


def _create(path: Path, key: str) -> None:
    temporary = path.with_name(f".{KEY_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
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
