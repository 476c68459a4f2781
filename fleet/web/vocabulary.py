"""The UI vocabulary each page sends its scripts in one config object (``views.page_context``,
rendered as the ``page-config`` json_script and read once by ``static/web/core.js``): operation
statuses, socket close codes, the GPU filters, MPS policy limits and drain steps come from the
server's own definitions instead of copies in JavaScript."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from fleet.core.events import CLOSE_NO_ROLE, CLOSE_SIGNED_OUT
from fleet.core.models import FINAL_STATUSES, OperationKind
from fleet.inventory.filters import GPU_FILTERS, FilterJson
from fleet.mps import MAX_CLIENTS_PER_GPU, MAX_COMPUTE_PERCENT
from fleet.web.presenters import NA_TITLE
from fleet.web.reasons import ReasonsConfig, reasons_config
from fleet.workflows.registry import step_labels

# The steps a drain operation's ``payload.step`` takes, as the editor's progress line words
# them: the drain workflow declares them (fleet/workflows/drain.py), and the registry serves them.
DRAIN_STEP_LABELS: dict[str, str] = dict(step_labels(OperationKind.DRAIN))

# The data-* attribute of a GPU card each filter reads in the browser (default: its name).
CARD_ATTRIBUTES: dict[str, str] = {"q": "search"}


class CardFilter(FilterJson):
    attr: str


class Limit(TypedDict):
    min: int
    max: int


class BaseConfig(TypedDict):
    role: str
    can_operate: bool
    can_deploy: bool
    final_statuses: list[str]
    close_codes: dict[str, int]
    na_title: str
    reasons: ReasonsConfig


def base_config(*, role: str, can_operate: bool, can_deploy: bool = False) -> BaseConfig:
    """What every page's scripts need: who is looking (``can_deploy``: acts on some team's
    deployments), when an operation is over, and what the live socket's close codes mean
    (``fleet.core.events``)."""
    return {
        "role": role,
        "can_operate": can_operate,
        "can_deploy": can_deploy or can_operate,
        "final_statuses": [str(status) for status in FINAL_STATUSES],
        "close_codes": {"signed_out": CLOSE_SIGNED_OUT, "no_role": CLOSE_NO_ROLE},
        "na_title": NA_TITLE,
        "reasons": reasons_config(),
    }


def gpu_filters(products: Iterable[str]) -> list[CardFilter]:
    """``fleet.inventory.filters.GPU_FILTERS`` for the browser, the products offered being the
    fleet's own, with the card attribute each one reads."""
    found: list[CardFilter] = []
    for spec in GPU_FILTERS:
        choices = [(p, p) for p in sorted(set(products))] if spec.name == "product" else None
        as_json = spec.as_json(choices)
        found.append({**as_json, "attr": CARD_ATTRIBUTES.get(spec.name, spec.name)})
    return found


def mps_limits(memory_mib: int) -> dict[str, Limit]:
    """The bounds of an MPS daemon policy on a device of ``memory_mib`` (``fleet.mps``'s rules:
    a thread percentage of 1..100, a pinned-memory limit within the device, clients up to the
    device's limit); the server checks the policy again, per instance, when it is applied."""
    return {
        "default_active_thread_percentage": {"min": 1, "max": MAX_COMPUTE_PERCENT},
        "default_pinned_mem_limit_mib": {"min": 1, "max": memory_mib},
        "max_clients": {"min": 1, "max": MAX_CLIENTS_PER_GPU},
    }


def editor_config(memory_mib: int) -> dict[str, Any]:
    return {"mps_limits": mps_limits(memory_mib), "drain_steps": DRAIN_STEP_LABELS}
