"""The built-in catalog against the facts file, and product / profile lookup."""

from __future__ import annotations

import pytest

from fleet.mig import PRODUCTS, Placement, find_product, product_by_key
from tests.mig.facts import MEASURED_GIB, PRODUCT_FACTS

MIG_PRODUCTS = [p for p in PRODUCTS if p.mig_capable]


@pytest.mark.parametrize("key", sorted(PRODUCT_FACTS))
def test_every_product_table_matches_the_facts_file(key):
    name, pci_ids, (memory_slices, compute_slices, max_instances), rows = PRODUCT_FACTS[key]
    product = product_by_key(key)

    assert product is not None
    assert (product.name, product.pci_device_ids, product.mig_capable) == (name, pci_ids, True)
    assert product.memory_slice_count == memory_slices
    assert product.compute_slice_count == compute_slices
    assert product.max_instances == max_instances
    actual = [
        (
            p.id,
            p.name,
            p.compute_slices,
            p.memory_slices,
            p.max_instances,
            tuple(pl.start for pl in p.placements),
            p.media,
        )
        for p in product.profiles
    ]
    assert actual == list(rows)
    for profile in product.profiles:
        assert all(pl.size == profile.memory_slices for pl in profile.placements)


@pytest.mark.parametrize("key", sorted(MEASURED_GIB))
def test_profile_memory_is_the_measured_gib_where_a_transcript_exists(key):
    product = product_by_key(key)
    assert product is not None
    for profile_id, gib in MEASURED_GIB[key].items():
        profile = product.profile(profile_id)
        assert profile is not None
        assert profile.memory_mib == round(gib * 1024)


def test_profile_memory_without_a_transcript_is_estimated_from_the_memory_fraction():
    product = product_by_key("a100-sxm4-80gb")
    assert product is not None
    by_name = {p.name: p.memory_mib for p in product.profiles}
    assert by_name["1g.10gb"] == 81920 // 8
    assert by_name["3g.40gb"] == 81920 // 2
    assert by_name["7g.80gb"] == 81920


@pytest.mark.parametrize("product", MIG_PRODUCTS, ids=lambda p: p.key)
def test_placements_stay_inside_the_grid_and_profiles_fit_the_gpu(product):
    for profile in product.profiles:
        assert profile.memory_mib <= product.memory_mib
        assert profile.compute_slices <= product.compute_slice_count
        for placement in profile.placements:
            assert placement.start >= 0
            assert placement.start + placement.size <= product.memory_slice_count


def test_product_keys_names_and_pci_ids_are_unique():
    keys = [p.key for p in PRODUCTS]
    names = [n.lower() for p in PRODUCTS for n in (p.name, *p.aliases)]
    pci_ids = [d for p in PRODUCTS for d in p.pci_device_ids]
    assert len(set(keys)) == len(keys)
    assert len(set(names)) == len(names)
    assert len(set(pci_ids)) == len(pci_ids)


def test_products_without_mig_have_no_profiles():
    no_mig = [p for p in PRODUCTS if not p.mig_capable]
    assert {p.name for p in no_mig} >= {"NVIDIA L4", "Tesla T4"}
    for product in no_mig:
        assert product.profiles == ()
        assert (product.memory_slice_count, product.compute_slice_count) == (0, 0)
        assert product.max_instances == 0


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("nvidia a100-sxm4-40gb", "a100-sxm4-40gb"),
        ("  NVIDIA   H100 80GB HBM3 ", "h100-sxm5-80gb"),
        ("NVIDIA GH200 120GB", "gh200-96gb"),
        ("NVIDIA GH200 480GB", "gh200-96gb"),
        ("NVIDIA H200 NVL", "h200-nvl-141gb"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000-maxq"),
        ("Tesla T4", "t4-16gb"),
    ],
)
def test_products_are_found_by_name_whatever_the_case_and_nvidia_prefix(name, key):
    product = find_product(name=name)
    assert product is not None
    assert product.key == key


@pytest.mark.parametrize(
    ("pci_device_id", "key"),
    [
        (0x20B0, "a100-sxm4-40gb"),
        (0x20B010DE, "a100-sxm4-40gb"),
        (0x233010DE, "h100-sxm5-80gb"),
        (0x2909, "b200-180gb"),
        (0x20B1, "a100-pcie-40gb"),
    ],
)
def test_products_are_found_by_16_or_32_bit_pci_device_id(pci_device_id, key):
    product = find_product(pci_device_id=pci_device_id)
    assert product is not None
    assert product.key == key


def test_the_pci_id_wins_over_a_stale_name():
    product = find_product(name="NVIDIA A30", pci_device_id=0x2330)
    assert product is not None
    assert product.key == "h100-sxm5-80gb"


def test_an_unknown_pci_id_falls_back_to_the_name():
    product = find_product(name="NVIDIA A30", pci_device_id=0x1234)
    assert product is not None
    assert product.key == "a30-24gb"


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"name": "NVIDIA GeForce RTX 4090"},
        {"pci_device_id": 0xFFFF},
        {"pci_device_id": 0x12345678},
    ],
)
def test_unknown_products_are_not_found(query):
    assert find_product(**query) is None


def test_products_are_found_by_key_case_insensitively():
    assert product_by_key("H200-SXM-141GB") is product_by_key("h200-sxm-141gb")
    assert product_by_key("nope") is None


@pytest.mark.parametrize(
    ("ref", "profile_id"),
    [
        (9, 9),
        ("9", 9),
        ("3g.20gb", 9),
        ("3G.20GB", 9),
        ("mig-3g.20gb", 9),
        (" 1g.5gb+me ", 20),
        ("1g.10gb", 15),
    ],
)
def test_profiles_are_found_by_id_name_or_sagemaker_type(ref, profile_id):
    product = product_by_key("a100-sxm4-40gb")
    assert product is not None
    profile = product.profile(ref)
    assert profile is not None
    assert profile.id == profile_id


def test_profiles_answer_to_names_older_drivers_printed():
    a100 = product_by_key("a100-sxm4-80gb")
    gb200 = product_by_key("gb200-186gb")
    assert a100 is not None
    assert gb200 is not None
    assert a100.profile("3g.39gb") == a100.profile("3g.40gb")
    assert gb200.profile("1g.24gb") == gb200.profile(19)


@pytest.mark.parametrize("ref", [1, "1", "1g.6gb", "", "mig-"])
def test_unknown_profiles_are_not_found(ref):
    product = product_by_key("a100-sxm4-40gb")
    assert product is not None
    assert product.profile(ref) is None


def test_reported_placements_override_the_catalog():
    product = product_by_key("h200-sxm-141gb")
    assert product is not None
    reported = {9: [Placement(4, 4), Placement(0, 4), Placement(4, 4)], 20: []}

    updated = product.with_placements(reported)

    three_g = updated.profile(9)
    assert three_g is not None
    assert three_g.placements == (Placement(0, 4), Placement(4, 4))
    assert updated.profile(20) is None, "a profile reported without placements is dropped"
    assert updated.profile(19) == product.profile(19), "unreported profiles keep theirs"
    assert product.profile(20) is not None, "the catalog itself is unchanged"


def test_reported_placements_may_change_a_profiles_size():
    product = product_by_key("a100-sxm4-40gb")
    assert product is not None
    updated = product.with_placements({5: [Placement(0, 3)]})
    four_g = updated.profile(5)
    assert four_g is not None
    assert four_g.memory_slices == 3
    assert four_g.placement_at(0) == Placement(0, 3)
    assert four_g.placement_at(4) == Placement(4, 3)


def test_placements_know_their_slices_and_overlaps():
    assert list(Placement(2, 2).slices) == [2, 3]
    assert Placement(0, 4).overlaps(Placement(3, 1))
    assert not Placement(0, 4).overlaps(Placement(4, 4))
    assert Placement(6, 2).overlaps(Placement(0, 8))


def test_a_profile_as_json_is_what_nvml_reports():
    from fleet.mig import product_by_key

    product = product_by_key("a100-sxm4-40gb")
    assert product is not None
    three = product.profile("3g.20gb")
    assert three is not None
    assert three.as_dict() == {
        "id": 9,
        "name": "3g.20gb",
        "compute_slices": 3,
        "memory_slices": 4,
        "memory_mib": three.memory_mib,
        "max_instances": 2,
        "placements": [[0, 4], [4, 4]],
    }
