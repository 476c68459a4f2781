"""``/oidc/``: the OIDC sign-in start, the provider's callback and back-channel logout."""

from __future__ import annotations

from django.urls import path

from fleet.core.sso.backchannel import backchannel_logout
from fleet.core.sso.oidc import OidcCallbackView, OidcStartView

app_name = "sso"

urlpatterns = [
    path("authenticate/", OidcStartView.as_view(), name="oidc-start"),
    path("callback/", OidcCallbackView.as_view(), name="oidc-callback"),
    path("backchannel-logout/", backchannel_logout, name="oidc-backchannel-logout"),
]
