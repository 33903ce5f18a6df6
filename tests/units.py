"""The systemd units and env file under deploy/, read the way systemd reads them, so tests run what they say."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
INSTALL_DIR = "/opt/layercake"  # where docs/production.md installs the code; the units' WorkingDirectory
VENV_PYTHON = f"{INSTALL_DIR}/venv/bin/python"
SERVER_UNITS = (
    "layercake-web",
    "layercake-ingest",
    "layercake-worker",
    "layercake-detect",
    "layercake-notify",
    "layercake-beat",
)


@dataclass
class Unit:
    name: str
    service: dict[str, list[str]]  # [Service] key -> every value given, in order

    def one(self, key: str) -> str:
        values = self.service.get(key, [])
        assert len(values) == 1, f"{self.name}: expected one {key}=, found {values}"
        return values[0]

    def environment(self) -> dict[str, str]:
        """The unit's Environment= assignments (space-separated, each may be quoted)."""
        return dict(
            item.split("=", 1) for line in self.service.get("Environment", []) for item in shlex.split(line)
        )

    def environment_files(self) -> list[tuple[str, bool]]:
        """EnvironmentFile= paths in the order systemd reads them (later ones win), each with whether it must
        exist (a leading "-" makes it optional)."""
        return [
            (path.lstrip("-"), not path.startswith("-")) for path in self.service.get("EnvironmentFile", [])
        ]

    def argv(self, env: dict[str, str]) -> list[str]:
        """ExecStart as systemd runs it: ${VAR} from env (one word), %% -> %; the venv's python is this one."""
        words = [_expand(word, env, self.name) for word in shlex.split(self.one("ExecStart"))]
        assert words[0] == VENV_PYTHON, f"{self.name}: ExecStart runs {words[0]}, not {VENV_PYTHON}"
        return [sys.executable, *words[1:]]


def read_unit(name: str) -> Unit:
    service: dict[str, list[str]] = {}
    section = ""
    for line in (DEPLOY / f"{name}.service").read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif line and not line.startswith(("#", ";")) and section == "Service":
            key, value = line.split("=", 1)
            service.setdefault(key.strip(), []).append(value.strip())
    return Unit(name, service)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines as systemd's EnvironmentFile= reads them (comments and blank lines skipped)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip().strip("\"'")
    return env


def write_env_file(path: Path, env: dict[str, str]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    return path


def _expand(word: str, env: dict[str, str], unit: str) -> str:
    def variable(match: re.Match) -> str:
        name = match.group(1)
        assert name in env, (
            f"{unit}: ExecStart uses ${{{name}}}, which neither the unit nor the env file sets"
        )
        return env[name]

    assert "%" not in word.replace("%%", ""), (
        f"{unit}: a systemd specifier in {word!r} (this reader knows only %%)"
    )
    return re.sub(r"\$\{(\w+)\}", variable, word).replace("%%", "%")


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and the example name), and its key."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=layercake.example.com",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:layercake.example.com",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def nginx_config(directory: Path, ports: dict[str, int]) -> Path:
    """deploy/nginx-layercake.conf in a runnable nginx.conf: this machine's certificate, and the ports given
    (http, https, upstream: the web unit's WEB_PORT, ingest: the ingest unit's INGEST_PORT, metrics: its
    LAYERCAKE_METRICS_LISTEN port) on 127.0.0.1 instead of 80, 443, 8000, 8001 and 9108."""
    cert, key = self_signed_cert(directory)
    site = (DEPLOY / "nginx-layercake.conf").read_text()
    for old, new in [
        ("/etc/letsencrypt/live/layercake.example.com/fullchain.pem", str(cert)),
        ("/etc/letsencrypt/live/layercake.example.com/privkey.pem", str(key)),
        ("listen [::]:80;", ""),
        ("listen [::]:443 ssl;", ""),
        ("listen 80;", f"listen 127.0.0.1:{ports['http']};"),
        ("listen 443 ssl;", f"listen 127.0.0.1:{ports['https']} ssl;"),
        ("server 127.0.0.1:8000;", f"server 127.0.0.1:{ports['upstream']};"),
        ("server 127.0.0.1:8000 backup;", f"server 127.0.0.1:{ports['upstream']} backup;"),
        ("server 127.0.0.1:8001;", f"server 127.0.0.1:{ports.get('ingest', 8001)};"),
        ("server 127.0.0.1:9108;", f"server 127.0.0.1:{ports.get('metrics', 9108)};"),
    ]:
        assert old in site, f"deploy/nginx-layercake.conf no longer has {old!r}"
        site = site.replace(old, new)
    (directory / "site.conf").write_text(site)
    conf = directory / "nginx.conf"
    conf.write_text(
        f"pid {directory}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
        f"http {{ access_log off; include {directory}/site.conf; }}\n"
    )
    return conf
