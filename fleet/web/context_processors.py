"""Template context for every dashboard page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from fleet.workflows.offline import OfflineShare, hosts_offline_share


def _mass_offline_share() -> OfflineShare | None:
    share = hosts_offline_share()
    return share if share.mass else None


def mass_offline(request: HttpRequest) -> dict[str, Any]:
    """``mass_offline``: the offline share while most hosts are offline together, else ``None``.

    Lazy: the one query runs only on pages that show the banner (not on fragments), and only
    for signed-in users.
    """
    if not request.user.is_authenticated:
        return {}
    return {"mass_offline": SimpleLazyObject(_mass_offline_share)}
