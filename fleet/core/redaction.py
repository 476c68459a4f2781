"""What a reader may not see, taken out of what it reads: another team's workload specs (the
API's ``workload`` fields, operation payloads) and the credentials and query strings of URLs
in the audit trail (a webhook's URL in its operation's summary).

Pure functions of the values; who may see a team's specs is
:func:`fleet.core.teams.can_see_spec`'s to say.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Operation payload keys that hold a workload spec, whole (a rollout's old and new version).
WORKLOAD_KEYS = ("workload", "previous")
# Payload keys that hold a part of one, or the sealed (encrypted) previous version.
SPEC_PART_KEYS = (
    "sealed_previous",
    "image",
    "image_pin",
    "command",
    "env",
    "cwd",
    "user",
    "health",
)
# A URL in free text: a scheme, ``://`` and everything up to white space or a quote, less the
# punctuation that ends a sentence.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{0,15}://[^\s<>\"']*[^\s<>\"'.,;:!?)\]]")
_AUTHORITY_END = re.compile(r"[/?#]")
_QUERY_START = re.compile(r"[?#]")


def workload_redacted(workload: Any) -> dict[str, Any]:
    """A workload as a reader who may not see it gets it: its runtime only, marked
    ``redacted`` (no image, command, env, cwd, user or health check)."""
    runtime = workload.get("runtime", "none") if isinstance(workload, Mapping) else "none"
    return {"runtime": str(runtime), "redacted": True}


def payload_redacted(payload: Any) -> Any:
    """An operation's payload without the workload specs it holds: each workload (``workload``,
    ``previous``) as :func:`workload_redacted` gives it, parts of one (``env``, ``command``,
    ...) left out. A payload that holds none comes back as it was."""
    if not isinstance(payload, Mapping):
        return payload
    if not any(key in payload for key in (*WORKLOAD_KEYS, *SPEC_PART_KEYS)):
        return payload
    kept = {key: value for key, value in payload.items() if key not in SPEC_PART_KEYS}
    for key in WORKLOAD_KEYS:
        if key in kept:
            kept[key] = workload_redacted(kept[key])
    return kept


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: no user name or password, no query string,
    no fragment (webhook URLs carry credentials there)."""
    scheme, _, rest = url.partition("://")
    # As urlsplit splits, without its ValueError on a malformed host: the authority ends at the
    # first '/', '?' or '#'; a host never holds '@', so what precedes the last one is userinfo.
    authority, path = _AUTHORITY_END.split(rest, maxsplit=1)[0], ""
    if len(authority) < len(rest) and rest[len(authority)] == "/":
        path = _QUERY_START.split(rest[len(authority) :], maxsplit=1)[0]
    return f"{scheme}://{authority.rpartition('@')[2]}{path}"


def url_shown(url: str) -> str:
    """What may be shown of a webhook's URL: ``scheme://host[:port]``, and ``/…`` when it has a
    path, a query or credentials (Slack's, Teams' and Discord's URLs are bearer secrets in
    their path)."""
    scheme, _, rest = url.partition("://")
    authority = _AUTHORITY_END.split(rest, maxsplit=1)[0]
    host = authority.rpartition("@")[2]
    more = rest[len(authority) :] not in ("", "/") or "@" in authority
    return f"{scheme}://{host}" + ("/…" if more else "")


def urls_redacted(text: str) -> str:
    """``text`` with every URL in it as :func:`redact_url` gives it."""
    if "://" not in text:
        return text
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
