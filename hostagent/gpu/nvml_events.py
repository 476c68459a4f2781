"""Xid and ECC event registration over NVML, one GPU at a time (review D7).

Registration used to run once for all GPUs: one GPU failing during it left every later GPU
without events for the life of the process, and GPUs that were lost or reset were never
registered again. Here each GPU is registered on its own; a GPU that failed is retried after
``retry_s``; a GPU seen lost is registered again when it is back; and when
``nvmlDeviceRegisterEvents`` answers UNKNOWN the set is freed and rebuilt, because nvml.h L9897
says "event set is in undefined state and should be freed".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from hostagent.gpu.nvml_lib import ABSENT, GPU_IS_LOST, TIMEOUT, UNKNOWN, Nvml

logger = logging.getLogger(__name__)

XID_MASK = 0x8  # nvmlEventTypeXidCriticalError
ECC_MASK = 0x1 | 0x2  # nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError
MAX_EVENTS_PER_WAIT = 64
DEFAULT_RETRY_S = 10.0


class EventRegistry:
    """One NVML event set and the GPUs registered in it."""

    def __init__(
        self,
        nv: Nvml,
        retry_s: float = DEFAULT_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nv = nv
        self.retry_s = retry_s
        self._clock = clock
        self._set: Any = None
        self.registered: set[str] = set()
        self._unsupported: set[str] = set()
        self._failed_at: dict[str, float] = {}

    def ensure(self, gpus: Iterable[tuple[str, Any]]) -> Any:
        """Register every ``(uuid, handle)`` not yet registered; the event set or ``None``."""
        todo = list(gpus)
        failed: set[str] = set()  # not retried within this call, whatever retry_s says
        for _ in range(len(todo) + 1):
            if self._set is None and not self._create():
                return None
            if self._register_all(todo, failed):
                break
        return self._set

    def forget(self, uuid: str) -> None:
        """The GPU was lost or reset: register it again once it answers."""
        self.registered.discard(uuid)
        self._unsupported.discard(uuid)
        self._failed_at.pop(uuid, None)

    def free(self) -> None:
        """``nvmlEventSetFree``; the next :meth:`ensure` builds a new set."""
        if self._set is not None:
            self._nv.quiet("nvmlEventSetFree", self._set)
        self._set = None
        self.registered.clear()

    def wait(self, timeout_ms: int) -> list[Any]:
        """``nvmlEventSetWait`` (``_v2``): what is queued, waiting up to ``timeout_ms`` for the
        first; TIMEOUT means none."""
        out: list[Any] = []
        wait_ms = timeout_ms
        while self._set is not None and len(out) < MAX_EVENTS_PER_WAIT:
            answer = self._nv.attempt("nvmlEventSetWait", self._set, wait_ms)
            if answer.code == TIMEOUT:
                break
            if not answer.ok:
                logger.warning("event wait failed: %s", answer.text)
                if answer.code != GPU_IS_LOST:
                    self.free()  # UNKNOWN and the like: rebuild the set on the next call
                break
            out.append(answer.value)
            wait_ms = 0
        return out

    def _create(self) -> bool:
        answer = self._nv.attempt("nvmlEventSetCreate")
        if not answer.ok:
            logger.warning("cannot create an NVML event set: %s", answer.text)
            return False
        self._set = answer.value
        return True

    def _due(self, uuid: str) -> bool:
        if uuid in self.registered or uuid in self._unsupported:
            return False
        failed = self._failed_at.get(uuid)
        return failed is None or self._clock() - failed >= self.retry_s

    def _register_all(self, gpus: list[tuple[str, Any]], failed: set[str]) -> bool:
        """False when the set had to be freed (the caller rebuilds it)."""
        for uuid, handle in gpus:
            if uuid in failed or not self._due(uuid):
                continue
            rebuild = not self._register(uuid, handle)
            if uuid not in self.registered and uuid not in self._unsupported:
                failed.add(uuid)
            if rebuild:
                return False
        return True

    def _register(self, uuid: str, handle: Any) -> bool:
        supported = self._nv.attempt("nvmlDeviceGetSupportedEventTypes", handle)
        if not supported.ok and supported.code not in ABSENT:
            self._failed_at[uuid] = self._clock()
            return True
        mask = (XID_MASK | ECC_MASK) & int(supported.value) if supported.ok else 0
        if not mask:
            self._unsupported.add(uuid)
            return True
        answer = self._nv.attempt("nvmlDeviceRegisterEvents", handle, mask, self._set)
        if answer.ok:
            self.registered.add(uuid)
            self._failed_at.pop(uuid, None)
            return True
        # Warn once per GPU; a GPU that keeps failing is retried every retry_s quietly.
        log = logger.debug if uuid in self._failed_at else logger.warning
        log("no Xid/ECC events from GPU %s yet: %s", uuid, answer.text)
        if answer.code in ABSENT:
            self._unsupported.add(uuid)
            return True
        self._failed_at[uuid] = self._clock()
        if answer.code == UNKNOWN:
            self.free()
            return False
        return True
