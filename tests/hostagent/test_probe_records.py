"""Probe records from real hosts (``tests/hostagent/fixtures/*.json``) against the MIG catalog
and the fake hardware that replays them. See ``fixtures/README.md``."""

from __future__ import annotations

import json

import pytest

from tests.hostagent.contract import nvml_on
from tests.hostagent.fake_gpu import FakeHardware
from tests.hostagent.probe_replay import catalog_mismatches, records

RECORDS = records()
_NONE = pytest.param(
    None,
    marks=pytest.mark.skip(reason="no probe record from a real GPU in tests/hostagent/fixtures"),
    id="no-records",
)
_PARAMS = [pytest.param(r, id=p.name) for p, r in RECORDS] or [_NONE]
_STABLE_KEYS = ("euid", "agent_version")  # the replaying process's, not the host's


@pytest.mark.parametrize("record", _PARAMS)
def test_the_catalog_places_every_profile_where_the_probed_driver_does(record):
    assert catalog_mismatches(record) == []


@pytest.mark.parametrize("record", _PARAMS)
def test_a_recorded_host_replays_as_fake_hardware(record):
    replay = nvml_on(FakeHardware.from_probe(record)).probe()
    for key in _STABLE_KEYS:
        replay[key] = record.get(key)
    assert replay == record


def test_the_catalog_check_accepts_a_record_of_the_catalogs_own_profiles():
    record = json.loads(json.dumps(nvml_on(FakeHardware("r570")).probe()))
    assert catalog_mismatches(record) == []
    record["gpus"][0]["gpu_instance_profiles"]["profiles"][0]["placements"] = [[1, 8]]
    assert len(catalog_mismatches(record)) == 1
