"""The browser socket's Origin rule (the CSRF rule for form posts), as a pure function."""

from __future__ import annotations

import pytest

from fleet.live.origin import origin_allowed


@pytest.mark.parametrize(
    ("origin", "host", "trusted", "allowed"),
    [
        ("https://fleet.example", "fleet.example", [], True),
        ("https://FLEET.example", "fleet.example", [], True),  # hosts compare without case
        ("http://127.0.0.1:8000", "127.0.0.1:8000", [], True),
        ("http://127.0.0.1:8001", "127.0.0.1:8000", [], False),  # another port, another origin
        ("https://fleet.example.evil.test", "fleet.example", [], False),
        ("null", "fleet.example", [], False),  # sandboxed frames and file pages
        ("", "fleet.example", [], False),
        ("https://fleet.example", "", [], False),
        ("https://fleet.example", "daphne:8000", ["https://fleet.example"], True),
        ("https://x.fleet.example", "daphne:8000", ["https://*.fleet.example"], True),
        ("https://fleet.example", "daphne:8000", ["https://*.fleet.example"], False),
        ("https://evilfleet.example", "daphne:8000", ["https://*.fleet.example"], False),
        ("http://fleet.example", "daphne:8000", ["https://fleet.example"], False),
    ],
)
def test_the_origin_is_the_servers_own_or_trusted(origin, host, trusted, allowed):
    assert origin_allowed(origin, host, trusted) is allowed
