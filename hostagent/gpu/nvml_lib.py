"""Calls into the ``pynvml`` module with every error translated at the boundary (review D1).

This module does not import ``pynvml``: :mod:`hostagent.gpu.nvml` hands it the module (or a
test double with the same call shapes). Three ways to call:

* :meth:`Nvml.attempt` never raises an NVML error; it returns the value or the error code (the
  probe and the fallbacks decide per code);
* :meth:`Nvml.call` raises the backend-neutral error for the code;
* :meth:`Nvml.field` is for one telemetry field: ``None`` whenever NVML has no value, except
  GPU_IS_LOST (the whole GPU is lost) and an uninitialised library.

``NVMLLibraryMismatchError`` (raised by the binding's ``@throwOnVersionMismatch`` wrappers when
the driver lacks the ``_v3`` symbol) is not an ``NVMLError``; it counts as FUNCTION_NOT_FOUND, as
does a name missing from an older nvidia-ml-py.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, NamedTuple

from hostagent.gpu.backend import (
    BackendError,
    GpuLost,
    GpuUnavailable,
    InsufficientResources,
    InUse,
    InvalidPlacement,
    NotFound,
    NotSupported,
)

logger = logging.getLogger(__name__)

# nvmlReturn_t values (nvml.h); compared on ``NVMLError.value`` so subclasses do not matter.
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

# No usable library: the agent keeps heartbeating with status "unavailable". 18 is the classic
# "driver upgraded without a reboot" (dask-cuda#949, gpustat#147).
UNAVAILABLE = frozenset(
    {UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH}
)
# NVML has no value for this GPU or this caller: the field is None.
ABSENT = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})
# Expected while enumerating profile constants (go-nvlib VisitMigProfiles skips these).
NO_SUCH_PROFILE = frozenset({NOT_SUPPORTED, INVALID_ARGUMENT})

_NAMES = {
    SUCCESS: "SUCCESS",
    UNINITIALIZED: "UNINITIALIZED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    NO_PERMISSION: "NO_PERMISSION",
    NOT_FOUND: "NOT_FOUND",
    INSUFFICIENT_SIZE: "INSUFFICIENT_SIZE",
    DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    TIMEOUT: "TIMEOUT",
    LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    GPU_IS_LOST: "GPU_IS_LOST",
    RESET_REQUIRED: "RESET_REQUIRED",
    LIB_RM_VERSION_MISMATCH: "LIB_RM_VERSION_MISMATCH",
    IN_USE: "IN_USE",
    INSUFFICIENT_RESOURCES: "INSUFFICIENT_RESOURCES",
    ARGUMENT_VERSION_MISMATCH: "ARGUMENT_VERSION_MISMATCH",
    UNKNOWN: "UNKNOWN",
}


def code_name(code: int) -> str:
    """``NVML_ERROR_*`` name without the prefix, or the number for codes not listed here."""
    return _NAMES.get(code, str(code))


def translate(code: int, text: str) -> BackendError:
    """The backend-neutral error for an ``nvmlReturn_t`` code."""
    if code in UNAVAILABLE:
        return GpuUnavailable(text)
    if code in ABSENT:
        return NotSupported(text)
    by_code: dict[int, type[BackendError]] = {
        IN_USE: InUse,
        INSUFFICIENT_RESOURCES: InsufficientResources,
        INVALID_ARGUMENT: InvalidPlacement,
        GPU_IS_LOST: GpuLost,
        NOT_FOUND: NotFound,
    }
    return by_code.get(code, BackendError)(text)


class Answer(NamedTuple):
    """What one NVML call gave: ``value`` when ``code`` is ``None``, else the error."""

    value: Any
    code: int | None = None
    text: str = ""

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.code is None

    def error(self) -> BackendError:
        """The translated error (only meaningful when not :attr:`ok`)."""
        return translate(self.code if self.code is not None else UNKNOWN, self.text)


class Nvml:
    """The ``pynvml`` module behind error translation."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        mismatch = getattr(module, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()

    def constant(self, name: str, default: int) -> int:
        """A ``pynvml`` constant, or ``default`` where an older binding lacks it."""
        value = getattr(self.module, name, default)
        return value if isinstance(value, int) else default

    def attempt(self, name: str, *args: Any) -> Answer:
        """Call ``pynvml.<name>(*args)``; never raises an NVML error."""
        fn = getattr(self.module, name, None)
        if fn is None:
            return Answer(None, FUNCTION_NOT_FOUND, f"{name}: not in this nvidia-ml-py")
        try:
            return Answer(fn(*args))
        except self.module.NVMLError as exc:
            value = getattr(exc, "value", None)
            return Answer(None, value if isinstance(value, int) else UNKNOWN, f"{name}: {exc}")
        except self._mismatch as exc:
            return Answer(None, FUNCTION_NOT_FOUND, f"{name}: {exc}")

    def call(self, name: str, *args: Any) -> Any:
        """Call ``pynvml.<name>(*args)``; an NVML error raises its backend error."""
        answer = self.attempt(name, *args)
        if not answer.ok:
            raise answer.error()
        return answer.value

    def field(self, name: str, *args: Any) -> Any:
        """One value of a GPU: ``None`` when NVML does not give it (NOT_SUPPORTED, NO_PERMISSION,
        an Unknown Error on this field, …). GPU_IS_LOST raises :class:`GpuLost` and an unusable
        library :class:`GpuUnavailable`, so the caller reports the GPU instead of the field."""
        answer = self.attempt(name, *args)
        if answer.ok:
            return answer.value
        if answer.code == GPU_IS_LOST or answer.code in UNAVAILABLE:
            raise answer.error()
        if answer.code not in ABSENT:
            logger.debug("%s", answer.text)
        return None

    def quiet(self, name: str, *args: Any) -> None:
        """Call for a side effect (free, shutdown); failures are logged, never raised."""
        answer = self.attempt(name, *args)
        if not answer.ok:
            logger.debug("%s", answer.text)
