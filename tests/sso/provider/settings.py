"""A tiny OIDC provider for the single sign-on tests: django-oauth-toolkit in OIDC mode, its
own SQLite database, users whose Django groups go out in a ``groups`` claim. Started in its own
process by :mod:`tests.sso.provider.serve`; never part of Fleet."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ["PROVIDER_STATE_DIR"])
ISSUER = os.environ["PROVIDER_ISSUER"]

SECRET_KEY = "provider-tests-only-" + "x" * 40
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.sso.provider.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [HERE / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(STATE / "db.sqlite3")}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; tests only
LOGIN_URL = "/accounts/login/"
# Cookies are per host, not per port: on 127.0.0.1 beside Fleet, ours must not replace Fleet's.
SESSION_COOKIE_NAME = "idp_sessionid"
CSRF_COOKIE_NAME = "idp_csrftoken"
USE_TZ = True
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": ISSUER,
    "OIDC_RSA_PRIVATE_KEY": (STATE / "rsa.pem").read_text(),
    "OAUTH2_VALIDATOR_CLASS": "tests.sso.provider.validator.GroupsValidator",
    # RP-initiated logout (end_session_endpoint in discovery): with a valid id_token_hint of the
    # signed-in user, it signs out without asking and returns to a registered URI.
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
    "SCOPES": {
        "openid": "OpenID Connect",
        "email": "E-mail",
        "profile": "Profile",
        "groups": "Groups",
    },
}
