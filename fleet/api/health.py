"""``/healthz``: the one endpoint besides login that needs no authentication."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults


def health(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"status": "unhealthy", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok"})


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A URL no route matches: the JSON error envelope under ``/api/``, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"code": "not_found", "message": f"No API endpoint at {request.path}.", "details": {}},
            status=404,
        )
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"code": "server_error", "message": "Internal server error.", "details": {}}, status=500
        )
    return defaults.server_error(request)
