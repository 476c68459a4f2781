"""The fleet view names a drop's target as people read it (issue 27: "Placing mps-demo on GPU
undefined · partition 135" appeared on every drop onto an MPS share or a whole GPU): its card's
``host/gpuN``, a MIG slice by the name its card shows, never ``undefined`` or a partition id.

Run: ``.venv/bin/pytest tests/browser/test_target_words.py -m browser -p no:cacheprovider``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.browser

DESCRIBE = """async () => {
  const base = document.querySelector('script[src*="fleet.js"]').src;
  const { describeTarget } = await import(new URL('fleet/targets.js', base).href);
  const card = document.querySelector('article.gpu');
  const slice = document.querySelector('article.gpu .slice[data-partition]');
  const sliceCard = slice ? slice.closest('article.gpu') : null;
  return {
    label: card.dataset.label,
    onCard: describeTarget(card, { gpu: Number(card.dataset.gpu) }),
    shareOnCard: describeTarget(card, { partition: 987654 }),
    noCard: describeTarget(null, { partition: 987654 }),
    noCardGpu: describeTarget(null, { gpu: 987654 }),
    namedGpu: describeTarget(null, { partition: 987654 }, Number(card.dataset.gpu)),
    slice: slice ? describeTarget(sliceCard, { partition: Number(slice.dataset.partition) }) : null,
    sliceName: slice ? slice.querySelector('.p')?.textContent : null,
    sliceLabel: sliceCard ? sliceCard.dataset.label : null,
  };
}"""


def test_a_drop_target_is_described_in_words_never_undefined(new_session: Any) -> None:
    session = new_session("operator")
    said = session.page.evaluate(DESCRIBE)
    assert said["onCard"] == said["label"] and said["shareOnCard"] == said["label"]
    # Without its card: its name when the page knows it, never a bare id.
    assert said["noCard"] == "the chosen GPU" and said["noCardGpu"] == "the chosen GPU"
    assert said["namedGpu"] == said["label"]
    if said["slice"] is not None:
        assert said["slice"] == f"{said['sliceLabel']} · {said['sliceName']}"
    for text in said.values():
        assert text is None or ("undefined" not in text and "987654" not in text), said
    assert session.errors == []
