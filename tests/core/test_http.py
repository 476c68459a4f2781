"""The client's address: REMOTE_ADDR, unless trusted proxies in front say otherwise."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from fleet.core.http import client_address


def request_from(remote: str, forwarded: str | None = None):
    extra = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().get("/", **extra)


@pytest.fixture
def proxies(settings):
    def configure(count: int | None) -> None:
        rest = {k: v for k, v in settings.REST_FRAMEWORK.items() if k != "NUM_PROXIES"}
        if count is not None:
            rest["NUM_PROXIES"] = count
        settings.REST_FRAMEWORK = rest

    return configure


def test_without_trusted_proxies_a_forged_forwarded_header_is_ignored(proxies):
    proxies(None)
    assert client_address(request_from("10.0.0.9", "1.2.3.4")) == "10.0.0.9"
    proxies(0)
    assert client_address(request_from("10.0.0.9", "1.2.3.4")) == "10.0.0.9"


def test_behind_one_proxy_the_address_it_saw_is_the_client(proxies):
    proxies(1)
    # The client forged the first entry; the proxy appended the address it really saw.
    assert client_address(request_from("10.0.0.2", "6.6.6.6, 203.0.113.7")) == "203.0.113.7"


def test_behind_two_proxies_the_second_entry_from_the_right_is_the_client(proxies):
    proxies(2)
    forwarded = "6.6.6.6, 203.0.113.7, 10.0.0.3"
    assert client_address(request_from("10.0.0.2", forwarded)) == "203.0.113.7"
    assert client_address(request_from("10.0.0.2", "203.0.113.8")) == "203.0.113.8"


def test_a_request_without_the_header_uses_the_peer_address(proxies):
    proxies(1)
    assert client_address(request_from("10.0.0.2")) == "10.0.0.2"
    assert client_address(request_from("10.0.0.2", " , ")) == "10.0.0.2"
