"""Reading ``FLEET_*`` settings from the environment (12-factor).

Every value has a safe default for the embedded mode. ``NAME_FILE`` may point at a file holding a
secret (Docker/Kubernetes secrets), as healthchecks does.
"""

from __future__ import annotations

import itertools
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


def env_floats(
    name: str, default: tuple[float, ...], *, low: float, high: float
) -> tuple[float, ...]:
    """A comma-separated list of as many numbers as ``default``, each within ``[low, high]``
    and not decreasing."""
    raw = env_list(name, [])
    if not raw:
        return default
    try:
        values = tuple(float(v) for v in raw)
    except ValueError:
        values = ()
    ordered = all(a <= b for a, b in itertools.pairwise(values))
    if len(values) != len(default) or not ordered or not all(low <= v <= high for v in values):
        raise ImproperlyConfigured(
            f"{name} must be {len(default)} comma-separated numbers from {low:g} to {high:g}, "
            f"not decreasing, e.g. {','.join(f'{v:g}' for v in default)}; got {','.join(raw)!r}"
        )
    return values


def require(name: str) -> str:
    """A setting production cannot start without; the message names the variable."""
    value = env(name, "")
    if not value:
        raise ImproperlyConfigured(
            f"{name} is required when FLEET_MODE=production "
            f"(set {name}, or {name}_FILE pointing at a file that holds it)."
        )
    return value
