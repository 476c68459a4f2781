"""The layout rollouts page: every rollout with its progress; operators get Resume and Abort."""

from __future__ import annotations

import pytest

from fleet.core.operations import operation_record

pytestmark = pytest.mark.django_db


def _rollout(**payload):
    return operation_record(
        kind="layout_rollout",
        summary="Layout rollout to 3 GPU(s), 1 at a time",
        status="dispatched",
        payload={
            "pending": [3],
            "draining": {"2": 9},
            "done": [1],
            "paused": None,
            "log": [],
            **payload,
        },
    )


def test_viewers_see_progress_and_no_buttons(viewer_web):
    _rollout()
    html = viewer_web.get("/rollouts/").content.decode()
    assert "<h1>Layout rollouts</h1>" in html
    assert 'value="1"' in html and "1/3 GPUs" in html and "1 draining" in html
    assert 'data-action="abort"' not in html


def test_operators_resume_a_paused_rollout_and_see_why_it_paused(operator_web):
    rollout = _rollout(paused="GPU 2: in_use: a stray process (pids 42)")
    html = operator_web.get("/ui/rollouts").content.decode()
    assert f'id="rollout-{rollout.pk}"' in html and "paused" in html
    assert "a stray process" in html
    assert 'data-action="resume"' in html and 'data-action="abort"' in html


def test_the_page_needs_a_login(client):
    assert client.get("/rollouts/").status_code in (302, 403)


def test_operators_get_a_new_rollout_form_offering_the_mig_products(operator_web, viewer_web):
    from tests.factories import GpuFactory

    gpu = GpuFactory(product_key="a30-24gb")
    GpuFactory(product_key="h100-sxm5-80gb", mig_capable=False)
    html = operator_web.get("/rollouts/").content.decode()
    assert 'id="rollout-new"' in html
    assert f"<option>{gpu.product_name}</option>" in html
    assert html.count("<option>") == 1  # a GPU that cannot take MIG is not offered
    assert 'id="rollout-new"' not in viewer_web.get("/rollouts/").content.decode()
