from __future__ import annotations

import pytest

from fleet.web.reasons import named_gpus, reason_sentence

NAMES = {33: "a100-b01/gpu0", 7: "h100-a02/gpu3"}


def name(pk: int) -> str | None:
    return NAMES.get(pk)


def test_a_mode_mismatch_reads_as_a_sentence_about_the_gpu():
    said = reason_sentence(
        "placement.mode_mismatch",
        "GPU 33 is in mig mode, not mps.",
        {"mode": "mig", "wanted": "mps"},
        name,
    )
    assert said == "a100-b01/gpu0 is split into MIG slices; MPS shares need an MPS GPU."


def test_a_reason_many_gpus_gave_is_said_of_all_of_them():
    said = reason_sentence(
        "placement.mode_mismatch",
        "GPU 33 is in mig mode, not mps.",
        {"mode": "mig", "wanted": "mps"},
        name,
        gpus=72,
    )
    assert said == "Each of 72 GPUs is split into MIG slices; MPS shares need an MPS GPU."


def test_without_a_name_it_is_this_gpu():
    said = reason_sentence("placement.gpu_busy", "GPU 99 already runs a workload.")
    assert said == "This GPU already runs a workload."


@pytest.mark.parametrize(
    ("code", "message", "details"),
    [
        ("placement.runtime", "GPU 7 runs workloads with the none runtime.", {}),
        ("placement.mode_mismatch", "GPU 7 is in odd mode, not mps.", {"mode": "odd"}),
    ],
)
def test_without_a_sentence_the_engine_s_words_keep_but_name_the_gpu(code, message, details):
    said = reason_sentence(code, message, details, name)
    assert said == message.replace("GPU 7", "h100-a02/gpu3")


def test_an_unknown_gpu_keeps_its_words():
    assert named_gpus("GPU 5 and GPU 33", name) == "GPU 5 and a100-b01/gpu0"
