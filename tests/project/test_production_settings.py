"""The production profile (LAYERCAKE_ENV=production) and the deploy/ examples: Django's deployment checks,
refusals of unsafe settings, the systemd units (systemd-analyze) and the nginx example (nginx -t)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest

from tests.units import DEPLOY, REPO, SERVER_UNITS, VENV_PYTHON, nginx_config, read_env_file, read_unit

SETTINGS_SHOWN = (
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "SESSION_COOKIE_SECURE",
    "SESSION_COOKIE_HTTPONLY",
    "CSRF_COOKIE_SECURE",
    "CSRF_COOKIE_HTTPONLY",
    "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_HSTS_SECONDS",
    "WHITENOISE_USE_FINDERS",
    "STATIC_ROOT",
)


def production_env(**changes: str | None) -> dict[str, str]:
    """The example env file with a fresh key, changed as given (None removes a variable)."""
    env = {**read_env_file(DEPLOY / "server.env.example"), "SECRET_KEY": secrets.token_urlsafe(50)}
    env.update(changes)
    return {"PATH": os.environ["PATH"], **{k: v for k, v in env.items() if v is not None}}


def run_python(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )


def loaded_settings(env: dict[str, str]) -> dict:
    code = (
        "import json; from django.conf import settings; "
        f"print(json.dumps({{k: getattr(settings, k) for k in {SETTINGS_SHOWN!r}}}, default=str))"
    )
    result = run_python({**env, "DJANGO_SETTINGS_MODULE": "layercake.settings"}, code)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def refusal(env: dict[str, str]) -> str:
    """The error that importing the settings ends with; fails the test if they load."""
    result = run_python(env, "import layercake.settings")
    assert result.returncode != 0, "the settings loaded"
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_it_passes_the_deploy_check_with_the_example_env():
    result = subprocess.run(
        ["scripts/check-deploy.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.slow
def test_it_fails_the_deploy_check_in_the_development_profile():
    env = production_env(LAYERCAKE_ENV="development")
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "security.W012" in result.stderr and "security.W004" in result.stderr  # insecure cookie, no HSTS


def test_it_turns_on_secure_cookies_hsts_and_the_proxy_header():
    loaded = loaded_settings(
        production_env(
            ALLOWED_HOSTS="a.example.com,b.example.com", CSRF_TRUSTED_ORIGINS="https://a.example.com"
        )
    )
    assert loaded["DEBUG"] is False
    assert loaded["ALLOWED_HOSTS"] == ["a.example.com", "b.example.com"]
    assert loaded["CSRF_TRUSTED_ORIGINS"] == ["https://a.example.com"]
    assert all(
        loaded[k] is True
        for k in (
            "SESSION_COOKIE_SECURE",
            "SESSION_COOKIE_HTTPONLY",
            "CSRF_COOKIE_SECURE",
            "CSRF_COOKIE_HTTPONLY",
            "SECURE_SSL_REDIRECT",
        )
    )
    assert loaded["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert loaded["SECURE_HSTS_SECONDS"] >= 31536000
    assert loaded["WHITENOISE_USE_FINDERS"] is False and loaded["STATIC_ROOT"] == "/var/lib/layercake/static"


def test_it_lets_the_environment_turn_off_the_redirect_and_secure_cookies():
    loaded = loaded_settings(production_env(SECURE_SSL_REDIRECT="false", SECURE_COOKIES="false"))
    assert loaded["SECURE_SSL_REDIRECT"] is False and loaded["SESSION_COOKIE_SECURE"] is False
    assert loaded["CSRF_COOKIE_HTTPONLY"] is True and loaded["DEBUG"] is False


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"])
def test_it_refuses_to_start_without_a_required_variable(missing):
    message = refusal(production_env(**{missing: None}))
    assert f"LAYERCAKE_ENV=production needs {missing} in the environment" in message


@pytest.mark.parametrize(
    "key",
    [
        "layercake-dev-only-secret-key-change-me-in-production-0123456789",  # the development default
        "django-insecure-" + secrets.token_urlsafe(50),
        secrets.token_urlsafe(20),
        "abcd" * 20,
    ],
)
def test_it_refuses_a_weak_secret_key(key):
    assert "SECRET_KEY is not fit for production" in refusal(production_env(SECRET_KEY=key))


def test_it_refuses_debug_in_production():
    assert "DEBUG must be off" in refusal(production_env(DEBUG="true"))


def test_it_refuses_an_unknown_profile():
    assert "LAYERCAKE_ENV must be development or production, not 'prod'" in refusal(
        production_env(LAYERCAKE_ENV="prod")
    )


@pytest.mark.parametrize("name", SERVER_UNITS)
def test_it_hardens_every_server_unit(name):
    unit = read_unit(name)
    expected = {
        "User": "layercake",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "Restart": "on-failure",
        "ReadWritePaths": "/var/lib/layercake",
        "CapabilityBoundingSet": "",
    }
    assert {key: unit.one(key) for key in expected} == expected
    assert unit.environment_files()[0] == ("/etc/layercake/server.env", True)  # every unit reads it first


def test_it_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    paths = []
    for (
        name
    ) in SERVER_UNITS:  # verify wants the ExecStart binary to exist: the venv's python becomes this one
        text = (DEPLOY / f"{name}.service").read_text().replace(VENV_PYTHON, sys.executable)
        paths.append(tmp_path / f"{name}.service")
        paths[-1].write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", *map(str, paths)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), result.stderr


def test_it_gives_nginx_a_valid_config(tmp_path):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx) or shutil.which("openssl") is None:
        pytest.skip("nginx or openssl is not installed")
    conf = nginx_config(tmp_path, {"http": 8080, "https": 8443, "upstream": 8000})
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
