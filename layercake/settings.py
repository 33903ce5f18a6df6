"""layercake settings: one file, every value from the environment with a safe default."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
# Everything the run command writes (logs, the admin login, agents' run dirs, demo models).
VAR_DIR = Path(os.environ.get("LAYERCAKE_VAR", BASE_DIR / "var"))


def envbool(name: str, default: str) -> bool:
    value = os.environ.get(name, default).lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ImproperlyConfigured(f"{name} must be true or false, not {value!r}")
    return value in ("true", "1", "yes")


def envfloat(name: str, default: str) -> float:
    value = os.environ.get(name, default)
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from None


DEBUG = envbool("DEBUG", "false")
SECRET_KEY = os.environ.get("SECRET_KEY", "layercake-dev-only-secret-key-change-me-in-production-0123456789")
ALLOWED_HOSTS = os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
SITE_URL = os.environ.get("SITE_URL", "http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_celery_beat",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "layercake.urls"
ASGI_APPLICATION = "layercake.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.alert_banner",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}"), conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Agents write while browsers read: WAL and a generous busy timeout keep SQLite from "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
    # A file, not memory, so that servers the end-to-end tests start share the test database; one per test
    # process so that two test runs on one machine do not share it.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / f"test-db-{os.getpid()}.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def channel_layers(redis_url: str) -> dict:
    # redis-py 8 times out socket reads after 5 s by default, exactly channels_redis's blocking-pop timeout:
    # idle consumers then crash with "Timeout reading from". Reads get a longer timeout than the pop.
    host = {"address": redis_url, "socket_timeout": 15}
    return {"default": {"BACKEND": "dashboard.channel_layer.RedisChannelLayer",
                        "CONFIG": {"hosts": [host], "capacity": 2000, "expiry": 30}}}


CHANNEL_LAYERS = channel_layers(REDIS_URL)

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Redis gives the task of a worker that died before acking it (acks late) to another worker only after this
# many seconds. It must exceed the longest a task runs, retry countdowns included (the worker holds those
# unacked too), or a task still running is started a second time; tests set a few seconds.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": envfloat("CELERY_VISIBILITY_TIMEOUT", "3600")}
# A deployment marked launching that its agent has not reported on after this many seconds gets its launch
# again (dashboard.tasks.resend_lost_launches): the worker that marked it may have been killed before sending,
# and the broker gives that task back only after the visibility timeout.
LAUNCH_RESEND_AFTER_S = envfloat("LAUNCH_RESEND_AFTER_S", "30")
CELERY_TASK_SERIALIZER = "json"
# Notifications have their own queue and worker (runstack starts it with -Q notify): a slow mail server or
# webhook never delays hang detection (evaluate_fleet) or planning on the default queue.
CELERY_TASK_ROUTES = {"dashboard.tasks.deliver_notifications": {"queue": "notify"}}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"

# How the fleet is judged: agents sample every AGENT_INTERVAL seconds; silent for
# STALE_AFTER_INTERVALS intervals means the node is shown stale.
AGENT_INTERVAL = envfloat("AGENT_INTERVAL", "1")
STALE_AFTER_INTERVALS = envfloat("STALE_AFTER_INTERVALS", "3")
SAMPLE_RETENTION_HOURS = envfloat("SAMPLE_RETENTION_HOURS", "24")
INGEST_FLUSH_SECONDS = envfloat("INGEST_FLUSH_SECONDS", "0.25")
FANOUT_SECONDS = envfloat("FANOUT_SECONDS", "0.5")

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "static"
WHITENOISE_USE_FINDERS = True

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = int(envfloat("EMAIL_PORT", "25"))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "layercake@localhost")
# Alert mails: at most ALERT_MAIL_LIMIT per operator channel within ALERT_MAIL_WINDOW_S; the rest are
# recorded as skipped and summarised in the next mail.
ALERT_MAIL_LIMIT = int(envfloat("ALERT_MAIL_LIMIT", "10"))
ALERT_MAIL_WINDOW_S = envfloat("ALERT_MAIL_WINDOW_S", "600")
ALERT_SMTP_TIMEOUT_S = envfloat("ALERT_SMTP_TIMEOUT_S", "15")
# Webhooks reach public internet addresses only; an admin allows named internal hosts (comma-separated host
# names or IP literals, matched against the URL's host). Short timeouts: a receiver that accepts and never
# answers holds a notify worker for WEBHOOK_CONNECT_TIMEOUT_S + WEBHOOK_READ_TIMEOUT_S at most per try.
WEBHOOK_ALLOWED_HOSTS = [h for h in os.environ.get("WEBHOOK_ALLOWED_HOSTS", "").split(",") if h.strip()]
WEBHOOK_CONNECT_TIMEOUT_S = envfloat("WEBHOOK_CONNECT_TIMEOUT_S", "3")
WEBHOOK_READ_TIMEOUT_S = envfloat("WEBHOOK_READ_TIMEOUT_S", "5")
# Alert storms: NODE_LOST_GROUP_MIN or more nodes lost within NODE_LOST_GROUP_WINDOW_S of each other open one
# incident (one alert, one mail) instead of one alert per node. A node lost alone waits out the window
# before its own alert opens, in case the others follow (Alertmanager's group_wait).
NODE_LOST_GROUP_MIN = int(envfloat("NODE_LOST_GROUP_MIN", "5"))
NODE_LOST_GROUP_WINDOW_S = envfloat("NODE_LOST_GROUP_WINDOW_S", "10")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

CELERY_BEAT_SCHEDULE = {
    "evaluate-fleet": {"task": "dashboard.tasks.evaluate_fleet", "schedule": AGENT_INTERVAL},
    "announce-silent-nodes": {"task": "dashboard.tasks.announce_silent_nodes", "schedule": AGENT_INTERVAL * 2},
    "prune-old-samples": {"task": "dashboard.tasks.prune_old_samples", "schedule": 3600.0},
    # Catches retries that came due and deliveries whose queued task was lost.
    "deliver-notifications": {"task": "dashboard.tasks.deliver_notifications", "schedule": 30.0},
    "resend-lost-launches": {"task": "dashboard.tasks.resend_lost_launches", "schedule": 10.0},
}
