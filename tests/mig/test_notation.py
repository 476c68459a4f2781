"""The ``profile@start`` text form used by the command line."""

from __future__ import annotations

import pytest

from fleet.mig import (
    Instance,
    NotationError,
    UnknownProfileError,
    format_instances,
    parse_instances,
)


def test_a_layout_is_parsed_in_the_order_written(a100):
    assert parse_instances(a100, " 3g.20gb@4, 1g.5gb@0,19@1") == (
        Instance(9, 4),
        Instance(19, 0),
        Instance(19, 1),
    )


@pytest.mark.parametrize(
    "text",
    ["", "3g.20gb", "3g.20gb@", "@4", "3g.20gb@x", "1g.5gb@0,,", "3g.20gb@\u00b3"],
)
def test_malformed_items_are_rejected(a100, text):
    with pytest.raises(NotationError):
        parse_instances(a100, text)


def test_unknown_profiles_are_rejected(a100):
    with pytest.raises(UnknownProfileError):
        parse_instances(a100, "1g.6gb@0")


def test_a_layout_is_formatted_by_start(a100):
    text = format_instances(a100, [Instance(9, 4), Instance(19, 0), Instance(77, 1)])
    assert text == "1g.5gb@0,77@1,3g.20gb@4"
    assert parse_instances(a100, "1g.5gb@0,3g.20gb@4") == (Instance(19, 0), Instance(9, 4))


def test_a_digit_that_is_not_a_decimal_is_no_profile_id(a100):
    """'³' is a digit to str.isdigit() but not a number to int(): it names no profile."""
    assert a100.profile("\u00b3") is None
    assert a100.profile("9") is not None
