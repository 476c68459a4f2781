"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Agent sockets authenticate with a host token and send no Origin header, so they are routed
before the browser sockets, which need a session and an Origin that is both an allowed host
and this server's own or a trusted one (:mod:`fleet.live.origin`).
"""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleet.settings.base")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from fleet.api.limits import BodySizeLimit  # noqa: E402
from fleet.live.agent import AgentConsumer  # noqa: E402
from fleet.live.routing import browser_sockets  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimit(django_asgi_app, max_bytes=settings.FLEET_MAX_REQUEST_BYTES),
        "websocket": URLRouter(
            [
                path("ws/agent/", AgentConsumer.as_asgi()),
                re_path(r"^", browser_sockets()),
            ]
        ),
    }
)


def _tune_gc() -> None:
    """A live server allocates thousands of short-lived objects a second (telemetry, frames),
    and Python's default thresholds then run full collections every few seconds over every
    object the imports made: 150-300 ms each on a loaded 2-core machine, a third of the CPU of
    a server carrying 4,000 GPUs, and the cause of 1-2 s latency spikes (measured with
    ``bench_live``). The objects that exist now (Django, the app, its caches) live as long as the
    process: they move to the permanent generation (``gc.freeze``), and the young generation
    is collected after ``FLEET_GC_THRESHOLD`` allocations instead of 700."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(settings.FLEET_GC_THRESHOLD, 20, 20)


_tune_gc()
