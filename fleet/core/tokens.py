"""Secret tokens: shown once, stored as a SHA-256 hash, looked up by a short public prefix."""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX_LENGTH = 8


def new_token(kind: str, *, prefix: str = "") -> str:
    """A new secret such as ``fla_3f9c1a2b_<43 url-safe chars>``; ``kind`` names its use.

    ``prefix`` keeps the public part of the token this one replaces (a host token's renewal):
    the replaced token stays findable by the prefix index while it is still accepted. The
    secret part is new either way."""
    prefix = prefix or secrets.token_hex(PREFIX_LENGTH // 2)
    return f"{kind}_{prefix}_{secrets.token_urlsafe(32)}"


def token_prefix(token: str) -> str:
    """The public part that tells tokens apart in lists (``3f9c1a2b``); ``""`` if malformed."""
    # At most two splits: the url-safe random part may itself contain "_".
    parts = token.split("_", 2)
    return parts[1] if len(parts) == 3 else ""


def legacy_token_prefix(token: str) -> str:
    """The prefix stored before the fix above: ``""`` whenever the random part held a ``_``
    (about half of the tokens issued then). Lookups by prefix accept both."""
    parts = token.split("_")
    return parts[1] if len(parts) == 3 else ""


def token_lookup_prefixes(token: str) -> list[str]:
    """Every prefix a row holding ``token`` may have stored (current and legacy)."""
    return sorted({token_prefix(token), legacy_token_prefix(token)})


def hash_token(token: str) -> str:
    # Tokens carry 256 bits of entropy, so a plain SHA-256 (no salt, no stretching) is enough.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), stored_hash)
