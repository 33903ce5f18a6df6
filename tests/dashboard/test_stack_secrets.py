"""Secrets and files of the demo stack: a SECRET_KEY generated into var/ (mode 600) instead of a published
one, the admin password printed only when it is made, and var/, the database and the logs kept private."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from dashboard import stack
from dashboard.management.commands.runstack import ensure_admin, login_line, protect_files, write_private
from layercake.settings import DEV_SECRET_KEY

OLD_DEFAULT_KEY = DEV_SECRET_KEY  # what run.sh used before


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def python(args: list[str], var_dir, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    environ |= {"LAYERCAKE_VAR": str(var_dir), "DJANGO_SETTINGS_MODULE": "layercake.settings", **env}
    return subprocess.run(
        [sys.executable, *args], cwd=stack.BASE_DIR, env=environ, capture_output=True, text=True, timeout=120
    )


def manage(args: list[str], var_dir, **env: str) -> subprocess.CompletedProcess:
    return python(["manage.py", *args], var_dir, **env)


PRINT_KEY = ["-c", "from django.conf import settings; print(settings.SECRET_KEY)"]


def test_it_generates_the_secret_key_into_var_once_and_keeps_it(tmp_path):
    first, second = python(PRINT_KEY, tmp_path / "var"), python(PRINT_KEY, tmp_path / "var")
    key = (tmp_path / "var" / "secret-key").read_text().strip()
    assert first.stdout.strip() == second.stdout.strip() == key
    assert len(key) >= 50 and key != DEV_SECRET_KEY
    assert mode(tmp_path / "var" / "secret-key") == 0o600 and mode(tmp_path / "var") == 0o700


def test_it_agrees_on_one_key_when_processes_start_together(tmp_path):
    code = (
        "import sys; from pathlib import Path; from layercake.settings import private_secret; "
        "print(private_secret(Path(sys.argv[1])))"
    )
    target = tmp_path / "var" / "shared-secret"
    env = {**os.environ, "LAYERCAKE_VAR": str(tmp_path / "var")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(target)],
            cwd=stack.BASE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    keys = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert keys == {target.read_text().strip()}
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "secret-key",
        "shared-secret",
    ]  # no drafts left


def test_it_refuses_the_published_development_key_outside_debug(tmp_path):
    refused = manage(["check", "--deploy"], tmp_path / "var", SECRET_KEY=OLD_DEFAULT_KEY)
    assert refused.returncode != 0
    assert "SECRET_KEY is a published development key" in refused.stderr
    in_debug = manage(["check"], tmp_path / "var", SECRET_KEY=OLD_DEFAULT_KEY, DEBUG="true")
    assert in_debug.returncode == 0, in_debug.stderr


@pytest.mark.django_db
def test_it_prints_the_admin_password_only_when_it_makes_it(tmp_path):
    password_file = tmp_path / "admin-login.txt"
    username, password = ensure_admin(password_file)
    assert password and password_file.read_text().strip() == password and mode(password_file) == 0o600
    assert login_line(username, password, password_file) == f"log in as admin / {password}"
    again = ensure_admin(password_file)
    assert again == ("admin", None)
    assert login_line(*again, password_file) == f"log in as admin (password in {password_file})"
    password_file.unlink()  # lost: a new password, printed once more
    _, renewed = ensure_admin(password_file)
    assert renewed and renewed != password and password_file.read_text().strip() == renewed


def test_it_writes_private_files_private_from_the_first_byte(tmp_path):
    old_umask = os.umask(0)
    try:
        write_private(tmp_path / "redis.conf", "requirepass x\n")
    finally:
        os.umask(old_umask)
    assert mode(tmp_path / "redis.conf") == 0o600


def test_it_makes_var_the_database_and_the_logs_private(tmp_path):
    var = tmp_path / "var"
    (var / "log").mkdir(parents=True)
    (var / "agents" / "a30-seed").mkdir(parents=True)
    database = var / "db.sqlite3"
    files = [
        database,
        var / "db.sqlite3-wal",
        var / "log" / "asgi.log",
        var / "agents" / "a30-seed" / "vllm.log",
    ]
    for path in files:
        path.write_text("x")
        path.chmod(0o644)
    var.chmod(0o755)
    protect_files(var, database)
    assert mode(var) == 0o700
    assert [mode(path) for path in files] == [0o600, 0o600, 0o640, 0o640]
