"""Heat buckets, telemetry shapes, presets and charts: the pure parts of the dashboard."""

from __future__ import annotations

import pytest

from fleet.mig import PRODUCTS, Instance, product_by_key, validate_layout
from fleet.web import charts
from fleet.web.editor import presets
from fleet.web.presenters import Live, SliceView, format_mib, heat_bucket


def test_heat_buckets_cover_0_to_100_and_none_is_not_available():
    assert heat_bucket(None) == "na"
    assert heat_bucket(0) == "0"
    assert heat_bucket(54) == "5"
    assert heat_bucket(100) == "10"
    assert heat_bucket(140) == "10"


def test_live_values_read_both_the_event_and_the_agent_sample_shapes():
    event = Live.from_raw({"utilization_percent": 40.0, "power_w": 300.0, "partitions": {"7": {}}})
    sample = Live.from_raw({"utilization_gpu_percent": 40, "power_mw": 300000})
    assert event.utilization_percent == sample.utilization_percent == 40.0
    assert event.power_w == sample.power_w == 300.0
    assert Live.from_raw({}).temperature_c is None
    assert Live.from_raw(None).utilization_percent is None


def test_every_preset_is_a_valid_layout_on_every_mig_product():
    for product in PRODUCTS:
        if not product.mig_capable:
            continue
        for preset in presets(product):
            instances = [Instance(i["profile_id"], i["start"]) for i in preset["instances"]]
            assert validate_layout(product, instances) == (), (product.key, preset["key"])


def test_h100_offers_all_1g_balanced_and_whole():
    product = product_by_key("h100-sxm5-80gb")
    assert product is not None
    found = {p["key"]: p["instances"] for p in presets(product)}
    assert len(found["all-1g"]) == 7
    assert found["whole"] == [{"profile_id": 0, "start": 0}]
    assert sorted(i["profile_id"] for i in found["balanced"]) == [9, 14, 19, 19]


def test_a_chart_breaks_its_line_where_a_value_is_missing():
    points = [
        {"t": 0.0, "v": 10.0},
        {"t": 10.0, "v": 20.0},
        {"t": 20.0, "v": None},
        {"t": 30.0, "v": 30.0},
    ]
    chart = charts.line_chart(points, charts.ChartSpec("v", "V", "", 100), t0=0, t1=30)
    assert chart.line.count("M") == 2
    assert chart.latest == 30.0
    empty = charts.line_chart(points[2:3], charts.ChartSpec("v", "V", "", 100), t0=0, t1=30)
    assert not empty.has_data and empty.line == ""


def test_downsampling_averages_and_keeps_none():
    points = [{"t": float(t), "u": float(t) if t < 5 else None} for t in range(10)]
    merged = charts.downsample(points, bucket_s=5)
    assert [p["u"] for p in merged] == [2.0, None]


def test_sizes_read_in_gib_with_one_decimal():
    assert format_mib(81920) == "80 GiB"
    assert format_mib(81559) == "79.6 GiB"
    assert format_mib(20091) == "19.6 GiB"
    assert format_mib(147456) == "144 GiB"
    assert format_mib(512) == "512 MiB"
    assert format_mib(None) == "n/a"


def test_card_memory_reads_used_over_total_in_one_unit():
    from fleet.web.presenters import format_mib_pair

    assert format_mib_pair(17612.8, 81559) == "17.2/79.6 GiB"
    assert format_mib_pair(0, 81920) == "0/80 GiB"
    assert format_mib_pair(None, 81920) == "n/a of 80 GiB"
    assert format_mib_pair(500, 800) == "500/800 MiB"


@pytest.mark.parametrize(
    ("profile", "size", "slice_count", "shown"),
    [
        ("2g.20gb", 2, 8, "2g"),  # a quarter of an H100 card: the compute size
        ("1g.10gb+me", 1, 8, "1g+me"),
        ("3g.40gb", 4, 8, "3g.40gb"),
        ("2g.12gb", 2, 4, "2g.12gb"),  # half of an A30 card: room for the name
    ],
)
def test_a_narrow_slice_shows_its_compute_size_and_a_wide_one_its_profile(
    profile, size, slice_count, shown
):
    view = SliceView(
        partition_id=1,
        profile=profile,
        start=0,
        size=size,
        memory_mib=1,
        allocations=(),
        pending=False,
        utilization_percent=None,
        memory_used_mib=None,
        mps_enabled=False,
        slice_count=slice_count,
    )
    assert view.short == shown
