"""Sessions and cookies, HTTPS, the content security policy, sign-in lockout and API tokens,
the caps on request bodies, and single sign-on (:mod:`fleet.settings.sso`)."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from fleet.settings.env import env, env_bool, env_int, env_list
from fleet.settings.mode import PRODUCTION

# Single sign-on (OIDC, LDAP, the group map, local accounts).
from fleet.settings.sso import *  # noqa: F403

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the dashboard's JavaScript reads it to send X-CSRFToken
SESSION_COOKIE_SECURE = PRODUCTION and env_bool("FLEET_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
CSRF_TRUSTED_ORIGINS = env_list("FLEET_CSRF_TRUSTED_ORIGINS", [])
SESSION_COOKIE_AGE = env_int("FLEET_SESSION_SECONDS", 12 * 3600)
# Messages live in the session, not in a signed (readable) cookie: the admin shows one-time
# enrollment tokens as messages.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# HTTPS. HSTS is sent on HTTPS responses only (behind a TLS-terminating load balancer, set
# FLEET_SECURE_PROXY_SSL_HEADER so Django knows a request came over HTTPS).
SECURE_HSTS_SECONDS = env_int("FLEET_HSTS_SECONDS", 365 * 86400 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FLEET_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("FLEET_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("FLEET_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # load balancers probe over plain HTTP
_proxy_ssl = env_list("FLEET_SECURE_PROXY_SSL_HEADER", [])
if _proxy_ssl and len(_proxy_ssl) != 2:
    raise ImproperlyConfigured(
        "FLEET_SECURE_PROXY_SSL_HEADER must be 'HEADER,value', e.g. 'HTTP_X_FORWARDED_PROTO,https'"
    )
SECURE_PROXY_SSL_HEADER = (_proxy_ssl[0], _proxy_ssl[1]) if _proxy_ssl else None
# check --deploy warns when these are off; they are the operator's choice, not a default:
# includeSubDomains and preload bind every host of the domain, and TLS usually ends (and
# redirects) at the load balancer (FLEET_SSL_REDIRECT makes Fleet redirect too).
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021", "security.W008"]

# Scripts only from our own origin (the templates have no inline script and no event handler
# attribute); inline styles stay allowed for the grid placements in style="" attributes.
FLEET_CONTENT_SECURITY_POLICY = env(
    "FLEET_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "form-action 'self'",
)

# Sign-in lockout (fleet.core.login_throttle), failed sign-ins kept for the admins, API tokens.
FLEET_LOGIN_FREE_FAILURES = env_int("FLEET_LOGIN_FREE_FAILURES", 5)
FLEET_LOGIN_MAX_LOCKOUT_SECONDS = env_int("FLEET_LOGIN_MAX_LOCKOUT_SECONDS", 900)
FLEET_LOGIN_FAILURES_KEEP_DAYS = env_int("FLEET_LOGIN_FAILURES_KEEP_DAYS", 30)
FLEET_MAX_API_TOKENS_PER_USER = env_int("FLEET_MAX_API_TOKENS_PER_USER", 50)

# Request bodies: the ASGI cap on any request (fleet.api.limits.BodySizeLimit, before Django
# spools it), then the JSON parsers' caps (fleet.api.parsers). Behind a reverse proxy, set its
# own cap (nginx client_max_body_size) to FLEET_MAX_REQUEST_BYTES or less.
FLEET_MAX_REQUEST_BYTES = env_int("FLEET_MAX_REQUEST_BYTES", 8 * 1024 * 1024)
FLEET_MAX_JSON_BYTES = env_int("FLEET_MAX_JSON_BYTES", 1024 * 1024)
FLEET_MAX_ENROLL_BYTES = env_int("FLEET_MAX_ENROLL_BYTES", 64 * 1024)
FLEET_MAX_REPORT_BYTES = env_int("FLEET_MAX_REPORT_BYTES", 4 * 1024 * 1024)
