"""Single sign-on (``docs/sso.md``): OIDC through mozilla-django-oidc, LDAP through
django-auth-ldap, the group map, and whether local passwords still sign in.

Each is off unless configured; a half-configured one fails at start with a clear message.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from fleet.core.sso.mapping import GroupMapError, group_map_parse
from fleet.settings.env import env, env_bool, env_int

AUTHENTICATION_BACKENDS = [
    # The OIDC backend answers None until it is configured; the LDAP one is listed only when
    # LDAP is (below): python-ldap is an optional, compiled dependency (``fleet[ldap]``).
    "fleet.core.sso.local.LocalBackend",
    "fleet.core.sso.oidc.OidcBackend",
]

try:
    FLEET_SSO_GROUP_MAP = group_map_parse(env("FLEET_SSO_GROUP_MAP", ""))
except GroupMapError as error:
    raise ImproperlyConfigured(str(error)) from None

# Local accounts: FLEET_LOCAL_LOGIN=off leaves only the break-glass user signing in by password.
FLEET_LOCAL_LOGIN = env_bool("FLEET_LOCAL_LOGIN", True)
FLEET_BREAK_GLASS_USER = env("FLEET_BREAK_GLASS_USER", "").strip()
if not FLEET_LOCAL_LOGIN and not FLEET_BREAK_GLASS_USER:
    raise ImproperlyConfigured(
        "FLEET_LOCAL_LOGIN=off needs FLEET_BREAK_GLASS_USER: the one local account that still "
        "signs in when the identity provider is down"
    )

# OIDC (authorization code flow with PKCE). Endpoints come from the issuer's discovery
# document, read on first use (fleet.core.sso.discovery), unless given one by one.
FLEET_OIDC_ISSUER = env("FLEET_OIDC_ISSUER", "").rstrip("/")
FLEET_OIDC_ENABLED = bool(FLEET_OIDC_ISSUER)
FLEET_OIDC_PROVIDER_NAME = env("FLEET_OIDC_PROVIDER_NAME", "single sign-on")
FLEET_OIDC_GROUPS_CLAIM = env("FLEET_OIDC_GROUPS_CLAIM", "groups")
FLEET_OIDC_USERNAME_CLAIM = env("FLEET_OIDC_USERNAME_CLAIM", "preferred_username")
FLEET_OIDC_ENDPOINTS = {
    "authorization_endpoint": env("FLEET_OIDC_AUTHORIZATION_ENDPOINT", ""),
    "token_endpoint": env("FLEET_OIDC_TOKEN_ENDPOINT", ""),
    "userinfo_endpoint": env("FLEET_OIDC_USERINFO_ENDPOINT", ""),
    "jwks_uri": env("FLEET_OIDC_JWKS_URI", ""),
    "end_session_endpoint": env("FLEET_OIDC_END_SESSION_ENDPOINT", ""),
}
# RP-initiated logout: signing out of Fleet after an OIDC sign-in also ends the session at the
# provider (its end_session_endpoint, with the ID token as the hint), which sends the browser
# back to Fleet's sign-in page. Off, or a provider that publishes no such endpoint: Fleet's
# session alone ends.
FLEET_OIDC_PROVIDER_LOGOUT = env_bool("FLEET_OIDC_PROVIDER_LOGOUT", True)
# The ID token is kept in the session for that hint (mozilla-django-oidc's setting).
OIDC_STORE_ID_TOKEN = True
OIDC_RP_CLIENT_ID = env("FLEET_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env("FLEET_OIDC_CLIENT_SECRET", "")
if FLEET_OIDC_ENABLED and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ImproperlyConfigured(
        "FLEET_OIDC_ISSUER is set: set FLEET_OIDC_CLIENT_ID and FLEET_OIDC_CLIENT_SECRET too"
    )
OIDC_RP_SCOPES = env("FLEET_OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = env("FLEET_OIDC_SIGN_ALGO", "RS256")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env_int("FLEET_OIDC_TIMEOUT_SECONDS", 10)
OIDC_VERIFY_SSL = env_bool("FLEET_OIDC_VERIFY_TLS", True)
OIDC_AUTHENTICATION_CALLBACK_URL = "sso:oidc-callback"
LOGIN_REDIRECT_URL = "/"
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"


FLEET_LDAP_ENABLED = bool(env("FLEET_LDAP_SERVER_URI", ""))
if FLEET_LDAP_ENABLED:
    try:
        from fleet.core.sso.ldap_config import ldap_settings
    except ImportError as error:
        raise ImproperlyConfigured(
            f"FLEET_LDAP_SERVER_URI is set but LDAP sign-in is not installed ({error}): "
            "pip install 'fleet[ldap]' (it compiles python-ldap: apt-get install gcc "
            "python3-dev libldap2-dev libsasl2-dev)"
        ) from None
    AUTHENTICATION_BACKENDS.insert(1, "fleet.core.sso.ldap.LdapBackend")

    if not env("FLEET_LDAP_USER_SEARCH_BASE", ""):
        raise ImproperlyConfigured(
            "FLEET_LDAP_SERVER_URI is set: set FLEET_LDAP_USER_SEARCH_BASE too"
        )
    try:
        _ldap = ldap_settings(
            server_uri=env("FLEET_LDAP_SERVER_URI"),
            bind_dn=env("FLEET_LDAP_BIND_DN", ""),
            bind_password=env("FLEET_LDAP_BIND_PASSWORD", ""),
            user_search_base=env("FLEET_LDAP_USER_SEARCH_BASE"),
            user_filter=env("FLEET_LDAP_USER_FILTER", "(uid=%(user)s)"),
            group_search_base=env("FLEET_LDAP_GROUP_SEARCH_BASE", ""),
            # Empty: the group type's own (objectClass=groupOfNames, posixGroup, group...).
            group_filter=env("FLEET_LDAP_GROUP_FILTER", ""),
            group_type=env("FLEET_LDAP_GROUP_TYPE", "groupOfNames"),
            start_tls=env_bool("FLEET_LDAP_START_TLS", False),
        )
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from None
    globals().update(_ldap)
