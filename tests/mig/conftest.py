from __future__ import annotations

import pytest

from fleet.mig import Instance, Product, product_by_key


def product(key: str) -> Product:
    found = product_by_key(key)
    assert found is not None, key
    return found


def layout(text: str, ids: dict[str, int]) -> tuple[Instance, ...]:
    """``"3g@4 1g@0"`` with ``ids`` mapping ``3g`` to a profile id."""
    instances = []
    for item in text.split():
        label, start = item.split("@")
        instances.append(Instance(ids[label], int(start)))
    return tuple(sorted(instances, key=lambda i: (i.start, i.profile_id)))


@pytest.fixture
def a100():
    return product("a100-sxm4-40gb")


@pytest.fixture
def a30():
    return product("a30-24gb")


@pytest.fixture
def rtx():
    return product("rtx-pro-6000-server")


@pytest.fixture
def l4():
    return product("l4-24gb")
