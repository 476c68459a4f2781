"""``manage.py simulated_gpus``: the simulation file of a GPU host without GPUs (the README's
Install tries Fleet with it), which the agent reads as it is, for the catalog's models only."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from hostagent.config import load_specs


def test_it_prints_a_file_the_agent_reads(tmp_path: Path) -> None:
    out = StringIO()
    call_command("simulated_gpus", "h100-sxm5-80gb", "--count", "2", "--seed", "7", stdout=out)
    path = tmp_path / "gpus.json"
    path.write_text(out.getvalue())

    specs, seed = load_specs(path)

    assert seed == 7
    assert [spec["name"] for spec in specs] == ["NVIDIA H100 80GB HBM3"] * 2
    assert specs[0]["mig_capable"] and specs[0]["profiles"]
    assert json.loads(out.getvalue())["gpus"] == specs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a40-48gb"], "unknown GPU model 'a40-48gb': one of a30-24gb"),
        (["a30-24gb", "--count", "0"], "--count: 1 to 16"),
        (["a30-24gb", "--count", "17"], "--count: 1 to 16"),
    ],
)
def test_a_model_outside_the_catalog_or_a_bad_count_is_refused(
    args: list[str], message: str
) -> None:
    out = StringIO()
    with pytest.raises(CommandError, match=message):
        call_command("simulated_gpus", *args, stdout=out)
    assert out.getvalue() == ""
