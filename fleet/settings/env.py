"""Reading ``FLEET_*`` settings from the environment (12-factor).

Every value has a safe default for the embedded mode. ``NAME_FILE`` may point at a file holding a
secret (Docker/Kubernetes secrets), as healthchecks does.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def env(name: str, default: str = "") -> str:
    """The value of ``name``, or of the file named by ``name_FILE``, or ``default``."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        return Path(file_name).read_text(encoding="utf-8").strip()
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = env(name, "")
    if not raw:
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = env(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = env(name, "")
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env(name, "")
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def require(name: str) -> str:
    """A setting production cannot start without; the message names the variable."""
    value = env(name, "")
    if not value:
        raise ImproperlyConfigured(
            f"{name} is required when FLEET_MODE=production "
            f"(set {name}, or {name}_FILE pointing at a file that holds it)."
        )
    return value
