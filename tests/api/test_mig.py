"""The MIG catalog and the dry-run validator."""

from __future__ import annotations

import pytest

from tests.factories import GpuFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db


def test_the_catalog_lists_products_profiles_and_placements(viewer_client):
    products = {p["key"]: p for p in viewer_client.get("/api/v1/mig/catalog/").json()}
    a100 = products["a100-sxm4-40gb"]
    assert a100["name"] == "NVIDIA A100-SXM4-40GB" and "0x20B0" in a100["pci_device_ids"]
    three = next(p for p in a100["profiles"] if p["name"] == "3g.20gb")
    assert (three["id"], three["placements"]) == (9, [[0, 4], [4, 4]])
    assert products["a30-24gb"]["max_instances"] == 4
    assert not products["l4-24gb"]["mig_capable"]


def validate(client, body):
    return client.post("/api/v1/mig/validate", body, format="json")


def test_a_valid_layout_validates_with_its_placements(viewer_client):
    body = validate(
        viewer_client,
        {
            "product": "NVIDIA A100-SXM4-40GB",
            "instances": [{"profile": "3g.20gb", "start": 4}, {"profile": "1g.5gb", "start": 0}],
        },
    ).json()
    assert body["valid"] and body["violations"] == []
    assert body["placements"][0] == {"profile": "3g.20gb", "profile_id": 9, "start": 4, "size": 4}


def test_an_invalid_layout_lists_every_violation_and_writes_nothing(viewer_client):
    before = snapshot_rows()
    body = validate(
        viewer_client,
        {
            "product": "a100-sxm4-40gb",
            "instances": [
                {"profile": "3g.20gb", "start": 0},
                {"profile": "4g.20gb", "start": 0},
                {"profile": "1g.5gb", "start": 7},
            ],
        },
    ).json()
    assert not body["valid"] and body["placements"] == []
    assert {v["code"] for v in body["violations"]} >= {"mig.overlap", "mig.placement_not_allowed"}
    assert snapshot_rows() == before


def test_products_can_be_named_by_pci_id(viewer_client):
    assert validate(
        viewer_client, {"product": "0x20B7", "instances": [{"profile": "4g.24gb", "start": 0}]}
    ).json()["valid"]


def test_unknown_profiles_are_violations(viewer_client):
    body = validate(
        viewer_client, {"product": "a30-24gb", "instances": [{"profile": "3g.20gb", "start": 0}]}
    ).json()
    assert body["violations"][0]["code"] == "mig.unknown_profile"


def test_validation_for_a_gpu_uses_its_reported_placements(viewer_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb", reported_placements={"19": [[0, 1]]})
    assert not validate(
        viewer_client, {"gpu": gpu.pk, "instances": [{"profile": "1g.10gb", "start": 3}]}
    ).json()["valid"]
    assert validate(
        viewer_client, {"gpu": gpu.pk, "instances": [{"profile": "1g.10gb", "start": 0}]}
    ).json()["valid"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"product": "NVIDIA GeForce 256", "instances": []}, 400, "mig.unknown_product"),
        ({"product": "0xZZZZ", "instances": []}, 400, "mig.unknown_product"),
        ({"instances": []}, 400, "invalid"),
        ({"product": "a30-24gb", "gpu": 1, "instances": []}, 400, "invalid"),
        ({"gpu": 999999, "instances": []}, 404, "gpu.not_found"),
        ({"product": "a30-24gb"}, 400, "invalid"),
    ],
)
def test_bad_validation_requests_get_clear_errors(viewer_client, body, status, code):
    body_out = assert_error(validate(viewer_client, body), status, code)
    if code == "mig.unknown_product":
        assert "NVIDIA A30" in body_out["details"]["known_products"]


def test_malformed_json_is_a_400_envelope(viewer_client):
    response = viewer_client.generic(
        "POST", "/api/v1/mig/validate", "{not json", content_type="application/json"
    )
    assert_error(response, 400, "malformed_request")


def test_wrong_methods_are_405_envelopes(viewer_client, operator_client):
    assert_error(operator_client.get("/api/v1/mig/validate"), 405, "method_not_allowed")
    assert_error(
        operator_client.patch("/api/v1/gpus/", {}, format="json"), 405, "method_not_allowed"
    )


def test_unknown_api_urls_are_404_envelopes(viewer_client):
    assert_error(viewer_client.get("/api/v1/gpus/0.5/"), 404, "not_found")
    assert_error(viewer_client.post("/api/v1/gpus/abc/cordon", {}, format="json"), 404, "not_found")


def test_huge_pagination_values_are_clamped_not_errors(viewer_client):
    huge = "198142217265306029430852176760977489920"
    for params in ({"limit": huge}, {"offset": huge}, {"limit": "0"}):
        response = viewer_client.get("/api/v1/deployments/", params)
        assert response.status_code == 200, params
        assert response.json()["results"] == []


MIGPARTED = """version: v1
mig-configs:
  inference:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "3g.40gb": 1
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices:
        "7g.80gb": 2
"""


def test_a_migparted_config_becomes_a_layout_with_placements(viewer_client, operator_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    body = viewer_client.post(
        "/api/v1/mig/migparted",
        {"yaml": MIGPARTED, "config": "inference", "gpu": gpu.pk},
        format="json",
    ).json()
    assert body["valid"] and body["violations"] == []
    assert (
        sorted((i["profile"], i["start"]) for i in body["layout"]["instances"])[0][0] == "1g.10gb"
    )
    assert (
        operator_client.put(
            f"/api/v1/gpus/{gpu.pk}/layout", body["layout"], format="json"
        ).status_code
        == 202
    )
    exported = viewer_client.get(f"/api/v1/gpus/{gpu.pk}/migparted")
    assert exported.status_code == 200 and exported["Content-Type"].startswith("application/yaml")
    from fleet.mig import parse_migparted

    ((_, (entry,)),) = parse_migparted(exported.content.decode()).mig_configs
    assert dict(entry.mig_devices) == {"3g.40gb": 1, "1g.10gb": 2} and entry.devices == (gpu.index,)


def test_migparted_errors_are_clear(viewer_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")

    def post(**body):
        return viewer_client.post("/api/v1/mig/migparted", {"gpu": gpu.pk, **body}, format="json")

    assert not post(yaml=MIGPARTED, config="too-much").json()["valid"]
    assert_error(post(yaml=MIGPARTED, config="nope"), 400, "migparted.unknown_config")
    assert_error(post(yaml="version: v2\nmig-configs: {}", config="x"), 400, "migparted.invalid")
    assert_error(
        viewer_client.post(
            "/api/v1/mig/migparted",
            {"gpu": 999999, "yaml": MIGPARTED, "config": "x"},
            format="json",
        ),
        404,
    )
    assert_error(viewer_client.get(f"/api/v1/gpus/{gpu.pk}/migparted"), 409, "migparted.not_mig")
