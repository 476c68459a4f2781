"""``/metrics`` per-GPU device series (dcgm-exporter's meaning, Fleet's names), and the shipped
Prometheus rules: valid (``promtool`` when installed) and naming only series Fleet exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet.allocations.services import DeploymentRequest, deployment_create
from fleet.core.models import OperationKind
from fleet.core.operations import operation_record
from fleet.inventory.models import HealthEvent
from tests.factories import GpuFactory

pytestmark = pytest.mark.django_db

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "fleet-rules.yml"

SAMPLE = {
    "temperature_c": 61.0,
    "power_mw": 312500,
    "ecc_corrected": 4,
    "ecc_uncorrected": 0,
    "utilization_gpu_percent": 50.0,
    "memory_used_mib": 1024,
}


def scrape(client) -> dict[str, list]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}


def xid(gpu, value: int) -> None:
    HealthEvent.objects.create(host=gpu.host, gpu=gpu, kind="xid", xid=value, ts=timezone.now())


def test_device_series_carry_few_labels_and_the_agents_values(viewer_client):
    gpu = GpuFactory(last_telemetry=SAMPLE, last_telemetry_at=timezone.now())
    xid(gpu, 13)
    xid(gpu, 79)
    families = scrape(viewer_client)
    labels = {"uuid": gpu.uuid, "host": gpu.host.name, "index": str(gpu.index)}
    (temp,) = families["fleet_gpu_temperature_celsius"]
    assert (temp.labels, temp.value) == (labels, 61.0)
    (power,) = families["fleet_gpu_power_usage_watts"]
    assert power.value == 312.5
    (sbe,) = [s for s in families["fleet_gpu_ecc_corrected_errors"] if s.name.endswith("_total")]
    assert sbe.value == 4
    (dbe,) = [s for s in families["fleet_gpu_ecc_uncorrected_errors"] if s.name.endswith("_total")]
    assert dbe.value == 0  # a reported zero is a zero
    (last,) = families["fleet_gpu_xid_errors"]
    assert (last.labels, last.value) == (labels, 79)
    (count,) = [s for s in families["fleet_gpu_xid_events"] if s.name.endswith("_total")]
    assert count.value == 2


def test_values_the_agent_reported_as_null_are_left_out_never_zero(viewer_client):
    GpuFactory(
        last_telemetry={**SAMPLE, "temperature_c": None, "power_mw": None, "ecc_corrected": None},
        last_telemetry_at=timezone.now(),
    )
    GpuFactory()  # never reported at all
    families = scrape(viewer_client)
    assert not families.get("fleet_gpu_temperature_celsius")
    assert not families.get("fleet_gpu_power_usage_watts")
    assert not families.get("fleet_gpu_ecc_corrected_errors")
    assert len(families["fleet_gpu_ecc_uncorrected_errors"]) == 1
    assert not families.get("fleet_gpu_xid_errors")


def test_each_host_has_one_status_series(viewer_client):
    gpu = GpuFactory()
    (row,) = scrape(viewer_client)["fleet_host_status"]
    assert row.labels == {"host": gpu.host.name, "status": gpu.host.status}


def _rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_rules_are_well_formed():
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}
    for group in document["groups"]:
        assert set(group) <= {"name", "rules", "interval"} and group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"Fleet[A-Za-z]+", rule["alert"])
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            assert rule["annotations"]["summary"]
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s"))
    alerts = {rule["alert"] for rule in _rules()}
    assert {
        "FleetGpuUnhealthy",
        "FleetHostOffline",
        "FleetStrandedCapacityHigh",
        "FleetOperationsFailing",
    } <= alerts


def test_every_series_the_rules_name_is_exported(viewer_client):
    gpu = GpuFactory(last_telemetry=SAMPLE, last_telemetry_at=timezone.now())
    xid(gpu, 79)
    deployment_create(
        name="chat", request=DeploymentRequest(kind="mps", memory_mib=1024), replicas=1
    )
    operation_record(kind=OperationKind.PLACE, summary="x", status="failed")
    exported = set()
    for name, samples in scrape(viewer_client).items():
        exported.add(name)
        exported.update(s.name for s in samples)
    named = {m for rule in _rules() for m in re.findall(r"\bfleet_[a-z_]+", rule["expr"])}
    assert named, "the rules name no series"
    assert named <= exported, named - exported


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules():
    result = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
