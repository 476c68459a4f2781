"""Every page sends its scripts one config object carrying the server's vocabulary (operation
statuses, socket close codes, filters, MPS limits, drain steps) instead of copies in JavaScript."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from fleet.allocations import drain
from fleet.core.events import CLOSE_NO_ROLE, CLOSE_SIGNED_OUT
from fleet.core.models import FINAL_STATUSES
from fleet.mps import MAX_CLIENTS_PER_GPU, MAX_COMPUTE_PERCENT
from fleet.web.presenters import NA_TITLE
from fleet.web.vocabulary import DRAIN_STEP_LABELS
from fleet.workflows import drain as drain_workflow
from tests.web.test_filters import page_config

pytestmark = pytest.mark.django_db

STATIC = Path(__file__).resolve().parents[2] / "static" / "web"


@pytest.mark.parametrize("persona", ["viewer_web", "operator_web"])
def test_every_page_carries_the_statuses_close_codes_and_role(request, persona, small_fleet):
    client = request.getfixturevalue(persona)
    gpu = small_fleet["mig"].pk
    for url in ("/", f"/gpus/{gpu}/", f"/gpus/{gpu}/layout/", "/operations/"):
        config = page_config(client.get(url).content.decode())
        assert config["final_statuses"] == [str(s) for s in FINAL_STATUSES]
        assert config["close_codes"] == {"signed_out": CLOSE_SIGNED_OUT, "no_role": CLOSE_NO_ROLE}
        assert config["na_title"] == NA_TITLE
        assert config["can_operate"] is (persona == "operator_web")


def test_the_fleet_page_carries_the_gpu_filters_with_the_fleet_products(operator_web, small_fleet):
    config = page_config(operator_web.get("/").content.decode())
    by_name = {f["name"]: f for f in config["gpu_filters"]}
    assert by_name["product"]["choices"] == [[small_fleet["mig"].product_name] * 2]
    assert (
        by_name["health"]["match"] == "exact" and ["lost", "Lost"] in by_name["health"]["choices"]
    )
    assert by_name["q"]["attr"] == "search" and by_name["free"]["match"] == "flag"


def test_the_editor_carries_the_mps_limits_of_the_domain_and_the_api(operator_web, small_fleet):
    from fleet.api.resources.mig.serializers import MpsPolicySerializer

    gpu = small_fleet["mps"]
    html = operator_web.get(f"/gpus/{gpu.pk}/layout/").content.decode()
    limits = page_config(html)["mps_limits"]
    assert limits == {
        "default_active_thread_percentage": {"min": 1, "max": MAX_COMPUTE_PERCENT},
        "default_pinned_mem_limit_mib": {"min": 1, "max": gpu.memory_mib},
        "max_clients": {"min": 1, "max": MAX_CLIENTS_PER_GPU},
    }
    fields = MpsPolicySerializer().fields
    for name, bounds in limits.items():  # the API accepts whatever the editor lets through
        assert fields[name].min_value <= bounds["min"] and bounds["max"] <= fields[name].max_value
    assert 'name="max_clients" min="1" max="48"' in html  # the MPS form draws them too


def test_every_drain_step_has_a_label_in_the_editor_config(operator_web, small_fleet):
    assert set(DRAIN_STEP_LABELS) == set(drain.DrainStep)
    # The drain names its steps only through the enum: no bare step string is left to miss
    source = inspect.getsource(drain).replace(inspect.getsource(drain.DrainStep), "")
    source += inspect.getsource(drain_workflow).split("DRAIN_STEP_LABELS")[2]
    assert not re.search(r"""[=(,]\s*["'](cordon|move|wait_idle|wait_apply|rollback)["']""", source)
    html = operator_web.get(f"/gpus/{small_fleet['mig'].pk}/layout/").content.decode()
    assert page_config(html)["drain_steps"] == DRAIN_STEP_LABELS


def test_no_script_keeps_a_copy_of_the_vocabulary():
    scripts = {p.relative_to(STATIC): p.read_text() for p in STATIC.rglob("*.js")}
    for path, text in scripts.items():
        assert not re.search(r"""\[\s*["']succeeded["'],\s*["']failed["']""", text), path
        assert "4401" not in text and "4403" not in text, path
        assert "wait_idle" not in text and "10_000_000" not in text, path
        assert '"unhealthy", "lost"' not in text, path
