"""The alerts page (admins): the webhooks alerts go to and the latest deliveries, with their
attempts and last answer. Admins add a webhook with a form (or the REST API)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.core.alerts import EVENTS
from fleet.core.models import AlertDelivery, AlertFormat, AlertWebhook
from fleet.core.roles import Role
from fleet.core.webhooks import MAX_SECRET_CHARS, MAX_URL_CHARS, MIN_SECRET_CHARS
from fleet.web.access import role_required
from fleet.web.views import page_context

DELIVERIES_SHOWN = 100


@role_required(Role.ADMIN)
def alerts(request: HttpRequest) -> HttpResponse:
    context = {
        **page_context(request, "alerts"),
        "webhooks": list(AlertWebhook.objects.order_by("id")),
        "deliveries": list(
            AlertDelivery.objects.select_related("webhook").order_by("-created_at", "-id")[
                :DELIVERIES_SHOWN
            ]
        ),
        "events": EVENTS,
        "formats": AlertFormat.choices,
        "min_secret_chars": MIN_SECRET_CHARS,
        "max_secret_chars": MAX_SECRET_CHARS,
        "max_url_chars": MAX_URL_CHARS,
        "shown": DELIVERIES_SHOWN,
    }
    return render(request, "web/alerts.html", context)
