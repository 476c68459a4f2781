"""``bench_wit``: its arguments are checked, and its percentiles are what they say."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.bench.wit import _percentiles


@pytest.mark.parametrize("args", [["--hosts", "0"], ["--hosts", "501"], ["--cold", "-1"]])
def test_out_of_range_arguments_are_refused(args):
    with pytest.raises(CommandError):
        call_command("bench_wit", *args)


def test_the_percentiles_of_samples():
    samples = [float(n) for n in range(1, 101)]
    assert _percentiles(samples) == {"p50_ms": 50.5, "p95_ms": 95.0, "max_ms": 100.0}
    assert _percentiles([]) == {"p50_ms": None, "p95_ms": None, "max_ms": None}
