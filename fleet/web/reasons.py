"""Refusal reasons in sentences an operator reads, and GPUs by their names.

The placement engine words its violations for logs and the API ("GPU 33 is in mig mode, not
mps."); the dashboard says the same thing about the GPU the operator is looking at ("This GPU
is split into MIG slices; MPS shares need an MPS GPU."), keyed on the stable violation code and
its details. The same templates reach the browser in the page config (``reasons``), so the
tray, the Place dialog, the drag preview and the toasts word a refusal alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

MODE_WORDS: dict[str, str] = {
    "mig": "split into MIG slices",
    "mps": "set up for MPS clients",
    "dedicated": "given whole to one workload",
}
WANTED_WORDS: dict[str, str] = {
    "mps": "MPS shares need an MPS GPU",
    "mig": "MIG replicas need a GPU split into MIG slices",
    "dedicated": "whole-GPU replicas need a dedicated GPU",
    "gpu": "whole-GPU replicas need a dedicated GPU",
}
SENTENCES: dict[str, str] = {
    "placement.mode_mismatch": "{This} is {mode_words}; {wanted_words}.",
    "placement.unhealthy": "{This} or its host is unhealthy.",
    "placement.cordoned": "{This} or its host is cordoned: it takes no new replicas.",
    "placement.gpu_busy": "{This} already runs a workload.",
    "placement.no_free_space": "No {profile} slice is free on {this}.",
    "placement.profile_unavailable": "{This} offers no {profile} slice ({product}).",
}
"""Sentences by violation code; ``{name}`` is a detail of the violation (``mode_words`` and
``wanted_words``: its ``mode`` and ``wanted`` in words; ``This``/``this``: "This GPU", or "Each
of 72 GPUs" for a reason many GPUs gave). A violation without an entry, or lacking a detail its
sentence names, keeps the engine's message, GPUs named."""

GPU_ID = re.compile(r"\bGPU (\d+)\b")


class ReasonsConfig(TypedDict):
    sentences: dict[str, str]
    mode_words: dict[str, str]
    wanted_words: dict[str, str]


def reasons_config() -> ReasonsConfig:
    return {"sentences": SENTENCES, "mode_words": MODE_WORDS, "wanted_words": WANTED_WORDS}


def reason_sentence(
    code: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    gpu_name: Callable[[int], str | None] = lambda _: None,
    *,
    gpus: int = 1,
) -> str:
    """The sentence for a violation, said of ``gpus`` GPUs that all gave it or of the one GPU
    it cites (by name: ``gpu_name`` names a GPU by its id, ``a100-b01/gpu0``; "this GPU" when
    it has none), the engine's words with GPUs named where no sentence fits."""
    template = SENTENCES.get(code)
    values = {str(k): v for k, v in (details or {}).items()}
    cited = [gpu_name(int(pk)) for pk in GPU_ID.findall(message)]
    named = cited[0] if len(cited) == 1 else None
    subject = f"each of {gpus} GPUs" if gpus > 1 else (named or "this GPU")
    # A GPU's name keeps its case, even at the start of the sentence.
    capital = subject if subject == named else subject[0].upper() + subject[1:]
    values["this"], values["This"] = subject, capital
    values["mode_words"] = MODE_WORDS.get(str(values.get("mode")), "")
    values["wanted_words"] = WANTED_WORDS.get(str(values.get("wanted")), "")
    if template is not None:
        try:
            sentence = template.format(**values)
        except (KeyError, IndexError, ValueError):
            sentence = ""
        if sentence and "{" not in sentence and " ;" not in sentence and "; ." not in sentence:
            return sentence
    return named_gpus(message, gpu_name)


def named_gpus(message: str, gpu_name: Callable[[int], str | None]) -> str:
    """``message`` with each ``GPU 33`` replaced by the GPU's name, where it has one."""

    def name(match: re.Match[str]) -> str:
        return gpu_name(int(match.group(1))) or match.group(0)

    return GPU_ID.sub(name, message)
