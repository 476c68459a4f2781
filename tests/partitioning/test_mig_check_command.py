"""``manage.py mig_check``: JSON out, exit 0 / 1 / 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


def run(*args: str, capsys) -> tuple[int, dict]:
    try:
        call_command("mig_check", *args)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, json.loads(capsys.readouterr().out)


def test_a_set_that_fits_prints_its_placements_and_exits_zero(capsys):
    code, report = run(
        "--gpu", "NVIDIA A100-SXM4-40GB", "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb", capsys=capsys
    )
    assert code == 0
    assert report == {
        "valid": True,
        "placements": [
            {"profile": "1g.5gb", "start": 0, "size": 1},
            {"profile": "1g.5gb", "start": 1, "size": 1},
            {"profile": "2g.10gb", "start": 2, "size": 2},
            {"profile": "3g.20gb", "start": 4, "size": 4},
        ],
        "violations": [],
    }


def test_a_set_that_does_not_fit_explains_why_and_exits_one(capsys):
    code, report = run("--gpu", "a100-sxm4-40gb", "3g.20gb", "3g.20gb", "1g.5gb", capsys=capsys)
    assert code == 1
    assert report["valid"] is False
    assert report["placements"] == []
    assert [v["code"] for v in report["violations"]] == ["mig.does_not_fit"]
    assert set(report["violations"][0]) == {"code", "message"}


def test_the_gpu_can_be_named_by_pci_id_and_profiles_by_id(capsys):
    code, report = run("--gpu", "0x20B0", "9", "mig-3g.20gb", capsys=capsys)
    assert code == 0
    assert [p["start"] for p in report["placements"]] == [0, 4]


def test_explicit_placements_are_checked_with_every_violation(capsys):
    code, report = run(
        "--gpu", "NVIDIA A100-SXM4-40GB", "--placed", "3g.20gb@4,2g.10gb@3,1g.5gb@0", capsys=capsys
    )
    assert code == 1
    assert report["placements"] == []
    assert [v["code"] for v in report["violations"]] == [
        "mig.placement_not_allowed",
        "mig.overlap",
    ]


def test_valid_explicit_placements_are_echoed_by_start(capsys):
    code, report = run("--gpu", "a30-24gb", "--placed", "2g.12gb@2,1g.6gb+me@0", capsys=capsys)
    assert code == 0
    assert report["placements"] == [
        {"profile": "1g.6gb+me", "start": 0, "size": 1},
        {"profile": "2g.12gb", "start": 2, "size": 2},
    ]


def test_a_gpu_without_mig_is_not_supported(capsys):
    code, report = run("--gpu", "NVIDIA L4", "1g.5gb", capsys=capsys)
    assert code == 1
    assert [v["code"] for v in report["violations"]] == ["mig.not_supported"]


def test_an_unknown_gpu_is_a_usage_error_listing_the_known_products():
    with pytest.raises(CommandError) as caught:
        call_command("mig_check", "--gpu", "NVIDIA GeForce RTX 4090", "1g.5gb")
    assert caught.value.returncode == 2
    assert "a100-sxm4-40gb: NVIDIA A100-SXM4-40GB" in str(caught.value)
    assert "NVIDIA H200 NVL" in str(caught.value)


def test_a_malformed_pci_id_is_an_unknown_gpu():
    with pytest.raises(CommandError) as caught:
        call_command("mig_check", "--gpu", "0xZZ", "1g.5gb")
    assert caught.value.returncode == 2


def test_an_unknown_profile_is_a_usage_error_listing_the_products_profiles():
    with pytest.raises(CommandError) as caught:
        call_command("mig_check", "--gpu", "NVIDIA A30", "1g.5gb")
    assert caught.value.returncode == 2
    assert "1g.6gb" in str(caught.value)
    assert "4g.24gb" in str(caught.value)


@pytest.mark.parametrize("placed", ["3g.20gb", "3g.20gb@x", "1g.5gb@0,"])
def test_malformed_placements_are_a_usage_error_listing_the_profiles(placed):
    with pytest.raises(CommandError) as caught:
        call_command("mig_check", "--gpu", "a100-sxm4-40gb", "--placed", placed)
    assert caught.value.returncode == 2
    assert "3g.20gb" in str(caught.value)


def test_an_unknown_profile_in_placements_is_a_usage_error():
    with pytest.raises(CommandError) as caught:
        call_command("mig_check", "--gpu", "a100-sxm4-40gb", "--placed", "1g.6gb@0")
    assert caught.value.returncode == 2


@pytest.mark.parametrize("args", [(), ("1g.5gb", "--placed", "1g.5gb@0")])
def test_profiles_and_placements_are_exclusive_and_one_is_required(args):
    with pytest.raises(CommandError) as caught:
        call_command("mig_check", "--gpu", "a100-sxm4-40gb", *args)
    assert caught.value.returncode == 2


def test_manage_py_exits_with_the_documented_status_codes():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fleet.settings.test"}

    def status(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "manage.py", "mig_check", *args]
        return subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, check=False
        )

    fits = status("--gpu", "NVIDIA A100-SXM4-40GB", "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")
    overlaps = status("--gpu", "a100-sxm4-40gb", "--placed", "3g.20gb@0,4g.20gb@0")
    unknown = status("--gpu", "nope", "1g.5gb")
    assert (fits.returncode, overlaps.returncode, unknown.returncode) == (0, 1, 2)
    assert json.loads(fits.stdout)["valid"] is True
    assert "Known products" in unknown.stderr
