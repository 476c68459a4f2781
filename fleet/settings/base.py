"""Fleet settings (``DJANGO_SETTINGS_MODULE=fleet.settings.base``). Everything comes from
``FLEET_*`` environment variables.

Django's own settings are here; the rest by concern: :mod:`.mode` (embedded or production, the
secrets, the database and Redis), :mod:`.security`, :mod:`.api`, :mod:`.workers` (cache,
channels, Celery), :mod:`.agents`, :mod:`.operations`, :mod:`.telemetry` and
:mod:`.integrations` (webhooks, registries, gateways).
"""

from __future__ import annotations

import dj_database_url
import django_stubs_ext

# The mode first: it checks FLEET_MODE and the secrets before any other setting is read.
from fleet.settings.mode import *  # noqa: F403
from fleet.settings.mode import ASSETS_DIR, DATABASE_URL, FLEET_DATA_DIR, PRODUCTION

# isort: split
from fleet.settings.agents import *  # noqa: F403
from fleet.settings.api import *  # noqa: F403
from fleet.settings.env import env
from fleet.settings.integrations import *  # noqa: F403
from fleet.settings.operations import *  # noqa: F403
from fleet.settings.security import *  # noqa: F403
from fleet.settings.telemetry import *  # noqa: F403
from fleet.settings.workers import *  # noqa: F403

# Lets admin.ModelAdmin[Model] and friends be subscripted at run time, as the type stubs expect.
django_stubs_ext.monkeypatch()

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "fleet.core",
    "fleet.inventory",
    "fleet.partitioning",
    "fleet.allocations",
    "fleet.endpoints",
    "fleet.autoscaling",
    "fleet.api",
    "fleet.web",
    "fleet.commands",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "fleet.core.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "fleet.core.middleware.LoginLockoutMiddleware",
]

ROOT_URLCONF = "fleet.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "fleet.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [ASSETS_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "fleet.web.context_processors.mass_offline",
            ],
        },
    },
]

if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
else:
    FLEET_DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(FLEET_DATA_DIR / "fleet.sqlite3"),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [ASSETS_DIR / "static"]
STATIC_ROOT = FLEET_DATA_DIR / "static"
# WhiteNoise serves static files in every mode; outside production it reads them from the apps
# directly, so the embedded mode needs no collectstatic.
WHITENOISE_USE_FINDERS = not PRODUCTION
WHITENOISE_AUTOREFRESH = not PRODUCTION
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("FLEET_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "celery.app.trace": {"level": env("FLEET_TASK_LOG_LEVEL", "WARNING")},
    },
}
