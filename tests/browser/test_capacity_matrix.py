"""Capacity by product in a real browser against the running demo stack: the matrix of MIG
profiles by product at the top says what fits now and after a reshape with the API's numbers,
choosing a product first narrows the page to it, and the fragmentation strip names each host.

Run: ``.venv/bin/pytest tests/browser/test_capacity_matrix.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

CELLS = """() => Object.fromEntries(
  [...document.querySelectorAll('#cap-matrix td[data-matrix-profile]')].map(td => {
    const product = td.closest('table').tHead.rows[0].cells[td.cellIndex].dataset.product;
    const now = Number(td.querySelector('.cap-now-n').textContent);
    const later = Number(td.querySelector('.cap-later-n').textContent);
    return [`${product} ${td.dataset.matrixProfile}`, [now, later, td.dataset.state]];
  }))"""


def _expected(capacity: dict[str, Any], key: str = "") -> dict[str, list[Any]]:
    cells: dict[str, list[Any]] = {}
    for product in capacity["products"]:
        if key and product["product_key"] != key:
            continue
        for p in product["mig"]["profiles"]:
            now, later = p["fits_now"], p["fits_if_idle_reshaped"]
            state = "now" if now else "reshape" if later else "none"
            cells[f"{product['product_key']} {p['profile']}"] = [now, later, state]
    return cells


def test_capacity_by_product_matrix_product_first_and_a_labelled_strip(
    new_session: Any, screenshots: Path
) -> None:
    session = new_session("viewer")
    page = session.page
    page.goto(f"{session.stack.url}/capacity/")
    session.wait_live()
    _, capacity = session.api("GET", "/api/v1/capacity/")

    # The matrix is the first thing under the product chooser, with every MIG product's numbers.
    first = page.locator("main section.panel").first
    assert first.get_by_role("heading").inner_text() == "MIG instances by product"
    assert page.evaluate(CELLS) == _expected(capacity)
    assert page.locator("#cap-matrix thead th[data-product]").count() >= 2
    strip = page.get_by_role("list", name="Fragmented share of each host's free GPU")
    hosts = capacity["fragmentation"]["hosts"]
    assert strip.locator("li").count() == len(hosts)
    first_host = strip.locator("li").first.inner_text()
    assert first_host.split()[0] == hosts[0]["host"]
    assert first_host.split()[1] == f"{round(100 * hosts[0]['score'])}%"
    page.screenshot(path=str(screenshots / "capacity-matrix.png"))

    # Product first: choosing one narrows the matrix, the products and the form's profiles.
    product = next(p for p in capacity["products"] if p["mig"]["profiles"])
    with page.expect_navigation():
        page.locator("#cap-product-choice").select_option(product["product_key"])
    session.wait_live()
    assert f"product={product['product_key']}" in page.url
    assert page.evaluate(CELLS) == _expected(capacity, product["product_key"])
    assert page.locator("section.cap-product").count() == 1
    offered = {p["profile"] for p in product["mig"]["profiles"]}
    choices = page.locator("#cap-profile option").all_inner_texts()
    assert choices and set(choices) == offered
    assert session.errors == []
