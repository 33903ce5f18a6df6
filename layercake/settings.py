"""layercake settings: one file, every value from the environment with a safe default."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
from datetime import timedelta
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


def private_secret(path: Path, nbytes: int = 32) -> str:
    """The secret kept in `path` (mode 600), generated there the first time. Created under a temporary name
    and linked into place, so that processes starting together all read the one secret."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(nbytes) + "\n")
    try:
        os.link(draft, path)
    except FileExistsError:
        pass  # another process got there first: use its secret
    finally:
        draft.unlink()
    return path.read_text().strip()


def envlist(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def required_env(name: str, example: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(
            f"LAYERCAKE_ENV=production needs {name} in the environment "
            f"(/etc/layercake/server.env), e.g. {example}"
        )
    return value


# The profile: "development" (the demo, ./run.sh and the tests) or "production" (deploy/, docs/production.md).
PROFILE = os.environ.get("LAYERCAKE_ENV", "development")
if PROFILE not in ("development", "production"):
    raise ImproperlyConfigured(f"LAYERCAKE_ENV must be development or production, not {PROFILE!r}")
PRODUCTION = PROFILE == "production"
# The development default of earlier versions: published, so sessions signed with it can be forged. Refused
# unless DEBUG is on; without SECRET_KEY the development profile generates one into var/secret-key instead.
DEV_SECRET_KEY = "layercake-dev-only-secret-key-change-me-in-production-0123456789"
NEW_KEY_COMMAND = "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"


def production_secret_key() -> str:
    """SECRET_KEY from the environment, refused if it is missing or as weak as Django's check calls weak."""
    key = required_env("SECRET_KEY", f"the output of {NEW_KEY_COMMAND}")
    if key == DEV_SECRET_KEY or key.startswith("django-insecure-") or len(key) < 50 or len(set(key)) < 5:
        raise ImproperlyConfigured(
            "SECRET_KEY is not fit for production (the development key, a "
            "'django-insecure-' key, or under 50 characters or 5 distinct ones); "
            f"make one with {NEW_KEY_COMMAND}"
        )
    return key


def development_secret_key() -> str:
    """SECRET_KEY from the environment, else the one generated into var/ on first use."""
    key = os.environ.get("SECRET_KEY") or private_secret(VAR_DIR / "secret-key", 50)
    if key == DEV_SECRET_KEY and not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is a published development key; unset it (a key is then generated "
            "into var/secret-key) or set a secret one"
        )
    return key


DEBUG = envbool("DEBUG", "false")
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured(
        "DEBUG must be off with LAYERCAKE_ENV=production (it shows settings and code to visitors)"
    )
SECRET_KEY = production_secret_key() if PRODUCTION else development_secret_key()
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "" if PRODUCTION else "localhost,127.0.0.1,[::1]")
if PRODUCTION and not ALLOWED_HOSTS:
    required_env("ALLOWED_HOSTS", "layercake.example.com")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")
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
    "axes",  # before dashboard: the roles give admins axes' permissions (dashboard.roles.sync_roles)
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "dashboard.static_files.StaticFilesMiddleware",  # WhiteNoise, async-capable: keeps requests off the sync thread
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into the lockout page
]

AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]

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
                "dashboard.roles.role_context",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        required_env("DATABASE_URL", "postgres://layercake:PASSWORD@127.0.0.1:5432/layercake")
        if PRODUCTION
        else os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}"),
        conn_max_age=60,
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

REDIS_URL = (
    required_env("REDIS_URL", "redis://:PASSWORD@redis.internal:6379/0")
    if PRODUCTION
    else os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
)


def channel_layers(redis_url: str) -> dict:
    # redis-py 8 times out socket reads after 5 s by default, exactly channels_redis's blocking-pop timeout:
    # idle consumers then crash with "Timeout reading from". Reads get a longer timeout than the pop.
    host = {"address": redis_url, "socket_timeout": 15}
    return {
        "default": {
            "BACKEND": "dashboard.channel_layer.RedisChannelLayer",
            "CONFIG": {"hosts": [host], "capacity": 2000, "expiry": 30},
        }
    }


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
# A plan request still "planning" after this many seconds lost its worker (planning takes about a second):
# dashboard.tasks.sweep_stale_plans queues it once more, then fails it with the reason.
PLAN_STALE_AFTER_S = envfloat("PLAN_STALE_AFTER_S", "120")
# A deployment still "planned" this long after it was created was never launched: it leaves the fleet page.
PLANNED_EXPIRE_AFTER_S = envfloat("PLANNED_EXPIRE_AFTER_S", "3600")
# The only directories whose config.json / GGUF files the server reads when a model path is typed in the deploy
# form (symlinks are followed before the check), like the agent's --model-dir; os.pathsep-separated, empty: none.
MODEL_DIRS = [Path(d) for d in os.environ.get("MODEL_DIRS", str(VAR_DIR / "models")).split(os.pathsep) if d]
CELERY_TASK_SERIALIZER = "json"
# Notifications have their own queue and worker (runstack starts it with -Q notify): a slow mail server or
# webhook never delays hang detection (evaluate_fleet) or planning on the default queue.
CELERY_TASK_ROUTES = {
    "dashboard.tasks.deliver_notifications": {"queue": "notify"},
    # Detection has its own queue and worker too (runstack: -Q detect): planning and launches never delay it.
    "dashboard.tasks.evaluate_fleet": {"queue": "detect"},
    "dashboard.tasks.announce_silent_nodes": {"queue": "detect"},
}
# A detection run that finds the previous one still going skips (dashboard.tasks.single_run); a run that
# died holding the lease loses it after this many seconds.
DETECT_LEASE_S = envfloat("DETECT_LEASE_S", "60")
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"

# How the fleet is judged: agents sample every AGENT_INTERVAL seconds; silent for
# STALE_AFTER_INTERVALS intervals means the node is shown stale.
AGENT_INTERVAL = envfloat("AGENT_INTERVAL", "1")
STALE_AFTER_INTERVALS = envfloat("STALE_AFTER_INTERVALS", "3")
# Tiered storage (dashboard/storage.py): raw samples this many hours, then min/avg/max per minute and per hour.
SAMPLE_RETENTION_HOURS = envfloat("SAMPLE_RETENTION_HOURS", "1")
MINUTE_RETENTION_DAYS = envfloat("MINUTE_RETENTION_DAYS", "7")
HOUR_RETENTION_DAYS = envfloat("HOUR_RETENTION_DAYS", "90")
LOG_RETENTION_HOURS = envfloat("LOG_RETENTION_HOURS", "24")
# A deployment's metric intervals (tokens/s, TTFT, queue: one row per scrape) for its charts; what calibration
# measured from them stays after they go.
METRIC_RETENTION_DAYS = envfloat("METRIC_RETENTION_DAYS", "7")
STORAGE_EVERY_S = envfloat("STORAGE_EVERY_S", "30")
INGEST_FLUSH_SECONDS = envfloat("INGEST_FLUSH_SECONDS", "0.25")
FANOUT_SECONDS = envfloat("FANOUT_SECONDS", "0.5")
# Agents' hellos worked on at once per process (0: no bound): one batch of the hello batcher's at most. In a
# 1,000-agent restart (bench/README.md, restart storm) 8 at a time took 125 trips to the database thread, each
# queued behind the ingest flush of the moment: every node fresh again after 21-33 s, against 11-13 s at 100.
HELLO_CONCURRENT = int(envfloat("HELLO_CONCURRENT", "100"))

# The REST API (/api/v1/, django-ninja): lists come in pages of 50 by default, 200 at most.
NINJA_PAGINATION_PER_PAGE = 50
NINJA_PAGINATION_MAX_LIMIT = 200
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Login lockout (django-axes): LOGIN_FAILURE_LIMIT wrong passwords for one username from one address lock
# that pair out for LOGIN_COOLOFF_MINUTES; a successful login clears the count. Admins lift a lockout in the
# admin (Access attempts) or with `manage.py axes_reset`.
AXES_FAILURE_LIMIT = int(envfloat("LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=envfloat("LOGIN_COOLOFF_MINUTES", "15"))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "dashboard.accounts.lockout_response"
# Password reset mails: at most PASSWORD_RESET_LIMIT per address and per client within PASSWORD_RESET_WINDOW_S
# (counted in the database, table dashboard_ratecount: every web process counts the same requests).
PASSWORD_RESET_LIMIT = int(envfloat("PASSWORD_RESET_LIMIT", "3"))
PASSWORD_RESET_WINDOW_S = envfloat("PASSWORD_RESET_WINDOW_S", "3600")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Development serves static files straight from static/ (scripts/setup.sh makes var/static). Production serves
# what collectstatic wrote to its state directory (LAYERCAKE_VAR), under content-hashed names (cached for a
# year) and pre-compressed, through whitenoise's middleware: Django's ASGI handler runs it for uvicorn's
# requests like any other middleware (reading each file in a thread: whitenoise's responses are synchronous);
# dashboard.static_files makes it async-capable so that the chain stays on the event loop.
STATIC_ROOT = VAR_DIR / "static" if PRODUCTION else BASE_DIR / "var" / "static"
WHITENOISE_USE_FINDERS = not PRODUCTION
if PRODUCTION:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    # Behind the TLS proxy (deploy/nginx-layercake.conf), which sets X-Forwarded-Proto on every request;
    # uvicorn listens on 127.0.0.1 only, so no client can set that header itself.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "true")
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = envbool("SECURE_COOKIES", "true")
    CSRF_COOKIE_HTTPONLY = True  # the pages post forms with the form token; no script reads the cookie
    SECURE_HSTS_SECONDS = int(envfloat("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", "true")
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "true")

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = int(envfloat("EMAIL_PORT", "25"))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "layercake@localhost")
# The demo's SMTP sink keeps mails here (runstack sets it); /demo/mails/ lists them. Unset: no such page.
DEMO_MAIL_DIR = os.environ.get("DEMO_MAIL_DIR", "")
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


def metrics_token_digest(name: str = "LAYERCAKE_METRICS_TOKEN") -> str:
    """The SHA-256 of the scrape token (the token itself is not kept), or "" when none is set."""
    token = os.environ.get(name, "").strip()
    if token and len(token) < 16:
        raise ImproperlyConfigured(
            f"{name} must be at least 16 characters (e.g. the output of {NEW_KEY_COMMAND}), not {len(token)}"
        )
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


def envnetworks(name: str, default: str = "") -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated addresses or CIDR networks, e.g. "10.0.0.5, 192.168.0.0/24, ::1"."""
    networks = []
    for item in envlist(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)"
            ) from None
    return networks


# /metrics (Prometheus): a scrape gets in with this bearer token or from an address in these networks; anything
# else gets 401 (no or a wrong token) or 403. With neither set, /metrics is closed.
METRICS_TOKEN_SHA256 = metrics_token_digest()
METRICS_ALLOW = envnetworks("LAYERCAKE_METRICS_ALLOW")


def envlisten(name: str) -> tuple[str, int] | None:
    """An IP address and port ("127.0.0.1:9108", "[::1]:9108"), or None when the variable is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    host, _, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(host)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(port)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name} must be an IP address and a port, e.g. 127.0.0.1:9108 or [::1]:9108, not {value!r}"
        ) from None
    return host, int(port)


def envproxies(name: str, default: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """uvicorn's FORWARDED_ALLOW_IPS: addresses or networks whose X-Forwarded-For is believed, or "*" (any)."""
    if envlist(name, default) == ["*"]:
        return [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    return envnetworks(name, default)


# /metrics on a socket of its own, answered by a thread of each web process, off the event loop that agent
# ingest keeps busy (dashboard/metrics_listener.py). Off unless set. With WEB_CONCURRENCY=N (uvicorn's
# --workers reads the same variable) each process takes the first free port of port..port+N-1.
METRICS_LISTEN = envlisten("LAYERCAKE_METRICS_LISTEN")
WEB_PROCESSES = int(envfloat("WEB_CONCURRENCY", "1"))
if WEB_PROCESSES < 1:
    raise ImproperlyConfigured(f"WEB_CONCURRENCY must be 1 or more, not {WEB_PROCESSES}")
if METRICS_LISTEN and METRICS_LISTEN[1] + WEB_PROCESSES - 1 > 65535:
    raise ImproperlyConfigured(
        f"LAYERCAKE_METRICS_LISTEN: ports {METRICS_LISTEN[1]}..{METRICS_LISTEN[1] + WEB_PROCESSES - 1} "
        "(one per WEB_CONCURRENCY process) go past 65535"
    )
# Who may set X-Forwarded-For on a scrape of that socket (nginx): the same variable and default as uvicorn's.
FORWARDED_ALLOW_IPS = envproxies("FORWARDED_ALLOW_IPS", "127.0.0.1")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"refusal_without_traceback": {"()": "dashboard.log_filters.RefusalWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"filters": ["refusal_without_traceback"]}},
}

CELERY_BEAT_SCHEDULE = {
    # A run still queued when the next is due is dropped (expires): a slow worker never works down a backlog.
    "evaluate-fleet": {
        "task": "dashboard.tasks.evaluate_fleet",
        "schedule": AGENT_INTERVAL,
        "options": {"expires": AGENT_INTERVAL},
    },
    "announce-silent-nodes": {
        "task": "dashboard.tasks.announce_silent_nodes",
        "schedule": AGENT_INTERVAL * 2,
        "options": {"expires": AGENT_INTERVAL * 2},
    },
    "maintain-storage": {"task": "dashboard.tasks.maintain_storage", "schedule": STORAGE_EVERY_S},
    # Catches retries that came due and deliveries whose queued task was lost.
    "deliver-notifications": {"task": "dashboard.tasks.deliver_notifications", "schedule": 30.0},
    "resend-lost-launches": {"task": "dashboard.tasks.resend_lost_launches", "schedule": 10.0},
    "sweep-stale-plans": {"task": "dashboard.tasks.sweep_stale_plans", "schedule": 30.0},
    "measure-deployments": {"task": "dashboard.tasks.measure_deployments", "schedule": 30.0},
    "expire-planned-deployments": {"task": "dashboard.tasks.expire_planned_deployments", "schedule": 60.0},
}
