"""The dashboard speaks the operator's language (issue 27), in a real browser against
``manage.py demo``: one status vocabulary on every surface and in the API, GPUs by name and
refusals in sentences, a grabbable chip for every placed replica, and colours that tell 0 %
from n/a.

Run: ``.venv/bin/pytest tests/browser/test_operator_words.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import drop_once_previewed

pytestmark = pytest.mark.browser

GPU_ID = re.compile(r"\bGPU \d+\b")
NVML_IDS = re.compile(r"\[\d+@\d+")
UNDEFINED = re.compile(r"\bundefined\b")
GPU_NAME = re.compile(r"[\w-]+/gpu\d+")


def _create(session: Any, name: str, **body: Any) -> dict[str, Any]:
    status, created = session.api("POST", "/api/v1/deployments/", {"name": name, **body})
    assert status == 201, created
    return dict(created)


def _deployment(session: Any, deployment_id: int) -> dict[str, Any]:
    status, body = session.api("GET", f"/api/v1/deployments/{deployment_id}/")
    assert status == 200, body
    return dict(body)


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout} s: {what}")


def _no_leaks(text: str, where: str) -> None:
    """What a page, a toast or an operation shows: no NVML ids, no "undefined", no GPU ids."""
    for pattern in (NVML_IDS, UNDEFINED, GPU_ID):
        found = pattern.search(text)
        assert found is None, (
            f"{where} shows {found.group(0)!r}: …{text[found.start() - 80 : found.end() + 80]}…"
        )


def _allocations(session: Any, deployment_id: int) -> list[dict[str, Any]]:
    status, body = session.api("GET", f"/api/v1/allocations/?deployment={deployment_id}")
    assert status == 200, body
    return list(body["results"])


def _toasts(page: Any) -> str:
    return "\n".join(page.locator("#toasts .toast").all_inner_texts())


def test_one_status_vocabulary_on_the_list_the_page_the_tray_capacity_and_the_api(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    url = session.stack.url
    fits = _create(session, "words-fits", kind="mps", memory_mib=512, replicas=2)
    waits = _create(session, "words-waits", kind="mps", memory_mib=4_000_000)
    try:
        # The API says what the pages say.
        assert _deployment(session, fits["id"])["status"] == "unplaced"
        assert _deployment(session, waits["id"])["status"] == "waiting"

        # The tray: each under its status, no heading without a deployment under it.
        page.goto(url + "/")
        session.wait_live()
        assert page.locator(f"#dep-{fits['id']}").get_attribute("data-status") == "unplaced"
        assert page.locator(f"#dep-{waits['id']}").get_attribute("data-status") == "waiting"
        empty_headings = page.evaluate(
            """() => [...document.querySelectorAll('#tray-list h3')].filter((h) => {
                 const next = h.nextElementSibling;
                 return !next || next.tagName !== 'ARTICLE';
               }).map((h) => h.textContent)"""
        )
        assert empty_headings == []
        waiting_heading = page.locator('#tray-list h3[data-section="waiting"]')
        assert (waiting_heading.text_content() or "").startswith("Waiting, no capacity")

        # The list: the same words, the reason of the one that waits, Place all for the other.
        page.goto(url + "/deployments/")
        fits_row = page.locator(f"#deployment-{fits['id']}")
        waits_row = page.locator(f"#deployment-{waits['id']}")
        assert fits_row.locator("[data-status]").text_content() == "unplaced, fits now"
        assert fits_row.get_by_role("button", name=re.compile("^Place all")).is_visible()
        assert waits_row.locator("[data-status]").text_content() == "waiting, no capacity"
        reason = waits_row.locator("[data-reason]").inner_text()
        assert reason and not GPU_ID.search(reason), reason

        # Capacity counts deployments by the same statuses.
        page.goto(url + "/capacity/")
        strip = page.locator("#cap-statuses")
        assert "waiting, no capacity" in strip.inner_text()
        assert "unplaced, fits now" in strip.inner_text()

        # The deployment page: its status, and Place all right there.
        page.goto(f"{url}/deployments/{fits['id']}/")
        session.wait_live()
        badge = page.locator("#dep-head [data-status]")
        assert badge.get_attribute("data-status") == "unplaced"
        assert "all 2 fit now" in page.locator("#dep-place").inner_text()
        page.screenshot(path=str(screenshots / "deployment-unplaced-fits-now.png"))
        page.locator("#dep-place").get_by_role("button", name="Place all").click()
        page.wait_for_function(
            "() => document.querySelector('#dep-head [data-status]')?.dataset.status === 'placed'",
            timeout=30_000,
        )
        assert _deployment(session, fits["id"])["status"] == "placed"
        assert page.locator("#dep-place").count() == 0
        _no_leaks(_toasts(page), "a toast")
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
    finally:
        for created in (fits, waits):
            session.api("DELETE", f"/api/v1/deployments/{created['id']}/")


def test_gpus_have_names_and_refusals_are_sentences_in_the_dialog_toasts_and_pages(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("operator")
    page = session.page
    url = session.stack.url
    share = _create(session, "words-share", kind="mps", memory_mib=1024)
    try:
        page.goto(url + "/")
        session.wait_live()
        dep = page.locator(f"#dep-{share['id']}")

        # The Place dialog: GPUs by name, reasons in sentences, the engine's choice, no score.
        dep.get_by_role("button", name="Place…").click()
        dialog = page.locator("#place-dialog")
        dialog.locator("button", has_text="Place here").first.wait_for(timeout=15_000)
        text = dialog.inner_text()
        _no_leaks(text, "the Place dialog")
        assert "score" not in text and "best fit" in text
        # Reasons grouped: one sentence for all the GPUs that gave it, their names folded.
        grouped = r"Each of (\d+) GPUs is split into MIG slices; MPS shares need an MPS GPU\."
        many = re.search(grouped, text)
        assert many, text
        group = dialog.locator("details.target-group", has_text=many.group(0))
        assert group.locator("li.target.no").count() == int(many.group(1))
        everything = dialog.text_content() or ""
        _no_leaks(everything, "the Place dialog's folded names")
        assert len(GPU_NAME.findall(everything)) > 10
        page.screenshot(path=str(screenshots / "place-dialog-names-and-reasons.png"))
        dialog.get_by_role("button", name="Close").click()

        # A drop where it does not fit: the toast names the GPU and says why in a sentence.
        mig_card = page.locator('article.gpu[data-mode="mig"]').first
        name = mig_card.get_attribute("data-label")
        drop_once_previewed(page, dep, mig_card)
        refusal = page.locator(".toast.error", has_text="does not fit")
        refusal.wait_for(timeout=15_000)
        said = refusal.inner_text()
        assert f"words-share does not fit on {name}" in said, said
        assert "split into MIG slices; MPS shares need an MPS GPU" in said, said
        _no_leaks(said, "the refusal toast")

        # A drop where it fits: the toast names the GPU (never "GPU undefined").
        _, targets = session.api("GET", f"/api/v1/deployments/{share['id']}/targets")
        mps_card = page.locator(f"#gpu-{targets['feasible'][0]['gpu']}")
        mps_name = mps_card.get_attribute("data-label")
        drop_once_previewed(page, dep, mps_card)
        page.locator(".toast", has_text=f"Placing words-share on {mps_name}").wait_for(
            timeout=15_000
        )
        _no_leaks(_toasts(page), "a toast")

        # Every page, and the operations' summaries, in the operator's words.
        pages = ["/", "/deployments/", f"/deployments/{share['id']}/", "/operations/"]
        pages += ["/capacity/", "/hosts/", "/rollouts/"]
        _, gpus = session.api("GET", "/api/v1/gpus/?mode=mig&limit=1")
        gpu = gpus["results"][0]
        pages += [f"/gpus/{gpu['id']}/", f"/hosts/{gpu['host']}/"]
        for path in pages:
            page.goto(url + path)
            page.wait_for_load_state("networkidle")
            _no_leaks(page.locator("body").inner_text(), path)
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{share['id']}/")


GRIPS = """() => [...document.querySelectorAll('[data-allocation][draggable="true"]')].map(
(chip) => {
  const grip = chip.querySelector('.rgrip');
  const box = grip ? grip.getBoundingClientRect() : {width: 0, height: 0};
  const where = chip.closest('.slice') ? 'mig' : chip.closest('.rchips') ? 'mps' : 'whole';
  return {where, width: box.width, height: box.height, cursor: getComputedStyle(chip).cursor,
          title: chip.title, id: chip.dataset.allocation};
})"""


def test_every_placed_replica_has_a_grip_a_move_cursor_and_a_tooltip(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    chips = page.evaluate(GRIPS)
    kinds = {c["where"] for c in chips}
    assert kinds == {"mig", "mps", "whole"}, kinds  # the demo places all three
    for chip in chips:
        assert chip["width"] >= 24 and chip["height"] >= 24, chip
        assert chip["cursor"] == "move", chip
        assert "Drag the grip" in chip["title"], chip
    assert session.errors == []


def test_the_replica_table_moves_a_replica_with_the_drag_s_fit_preview(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    url = session.stack.url
    moved = _create(session, "words-move", kind="mps", memory_mib=512, auto=True)
    try:
        before = _wait(lambda: _allocations(session, moved["id"]), 20, "the replica placed")[0]
        page.goto(f"{url}/deployments/{moved['id']}/")
        session.wait_live()
        page.locator("#replicas").get_by_role("button", name=re.compile("^Move replica 0")).click()
        dialog = page.locator("#target-dialog")
        assert dialog.locator("#target-title").inner_text() == "Move words-move[0]"
        choice = dialog.locator(f'button[data-gpu]:not([data-gpu="{before["gpu"]}"])').first
        choice.wait_for(timeout=15_000)
        _no_leaks(dialog.inner_text(), "the Move dialog")
        assert len(GPU_NAME.findall(dialog.text_content() or "")) > 10
        target = int(choice.get_attribute("data-gpu") or 0)
        choice.click()
        _wait(
            lambda: [
                a
                for a in _allocations(session, moved["id"])
                if a["gpu"] == target and a["state"] != "releasing"
            ],
            30,
            "the replica moved to the chosen GPU",
        )
        _no_leaks(_toasts(page), "a toast")
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{moved['id']}/")


def test_scaling_up_places_the_new_replicas_that_fit_when_asked(new_session: Any) -> None:
    session = new_session("operator")
    page = session.page
    grown = _create(session, "words-grow", kind="mps", memory_mib=512)
    try:
        status, _ = session.api("POST", f"/api/v1/deployments/{grown['id']}/place-all", {})
        assert status == 202
        page.goto(f"{session.stack.url}/deployments/{grown['id']}/")
        session.wait_live()
        assert page.locator("#scale-place").is_checked()  # the default
        page.locator("#replicas-input").fill("3")
        page.locator("#scale-form").get_by_role("button", name="Scale").click()
        _wait(
            lambda: _deployment(session, grown["id"])["placed_replicas"] == 3,
            30,
            "the two new replicas placed",
        )
        page.wait_for_function(
            "() => document.querySelector('#dep-head [data-status]')?.dataset.status === 'placed'",
            timeout=20_000,
        )
        assert page.locator('#replicas tr[data-allocation-state="unplaced"]').count() == 0
        assert page.locator(".toast.error").count() == 0
        assert session.errors == []
    finally:
        session.api("DELETE", f"/api/v1/deployments/{grown['id']}/")


LUMINANCE = """(colour) => {
  const probe = document.createElement('i');
  probe.style.color = colour;
  document.body.append(probe);
  const [r, g, b] = getComputedStyle(probe).color.match(/\\d+/g).map(Number);
  probe.remove();
  const lin = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}"""


def test_no_value_is_grey_and_hatched_and_unlike_zero_percent(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    style = page.evaluate(
        """() => { const s = getComputedStyle(document.documentElement);
                   return {hatch: s.getPropertyValue('--hatch'),
                           zero: s.getPropertyValue('--h0')}; }"""
    )
    assert "repeating-linear-gradient" in style["hatch"]
    stripes = re.findall(r"#[0-9a-fA-F]{6}", style["hatch"])
    zero = page.evaluate(LUMINANCE, style["zero"].strip())
    lightest = max(page.evaluate(LUMINANCE, c) for c in stripes)
    # The n/a stripes stand out from the 0 % blue (a contrast ratio of 1.5 or more).
    assert (lightest + 0.05) / (zero + 0.05) >= 1.5, (stripes, style["zero"])
    # The legend says it in words.
    assert page.locator(".legend .lg", has=page.locator(".sw.na")).inner_text().strip() == "n/a"
    assert session.errors == []


def test_profile_names_fit_their_slice_and_narrow_slices_say_2g(new_session: Any) -> None:
    session = new_session("viewer")
    page = session.page
    labels = page.evaluate(
        """() => [...document.querySelectorAll('article.gpu .slice .p')].map((p) => ({
             text: p.textContent, cut: p.scrollWidth > p.clientWidth + 1,
             size: Number(p.closest('.slice').dataset.size),
             n: Number(getComputedStyle(p.closest('.slices')).getPropertyValue('--n')),
             title: p.closest('.slice').title,
             product: p.closest('article.gpu').dataset.product}))"""
    )
    hopper = [label for label in labels if re.search(r"H100|H200", label["product"])]
    assert hopper, "the demo has H100 and H200 GPUs in MIG mode"
    cut = [label for label in hopper if label["cut"]]
    assert cut == [], cut
    narrow = [label for label in hopper if label["size"] * 4 <= label["n"]]
    assert narrow, "the demo has narrow slices"
    for label in narrow:
        assert re.fullmatch(r"\dg(\+me)?", label["text"]), label
        assert label["title"].startswith(label["text"].removesuffix("+me") + "."), label
    assert session.errors == []
