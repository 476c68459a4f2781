from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from fleet.api.health import health
from fleet.api.metrics import metrics

urlpatterns = [
    path("", include("fleet.web.urls")),
    path("healthz", health, name="health"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("oidc/", include("fleet.core.sso.urls")),
    path("api/v1/", include("fleet.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path(
        "api/docs/",
        # The split view serves its init script from this URL (?script=), not inline: the
        # Content-Security-Policy allows scripts from our own origin only.
        login_required(SpectacularSwaggerSplitView.as_view(url_name="schema")),
        name="api-docs",
    ),
]

handler404 = "fleet.api.health.not_found"
handler500 = "fleet.api.health.server_error"
