"""Deploy end to end through the REST API only, with personal API tokens (the README's curl steps): an admin
issues the node's agent token, an operator plans the seed's model on the fleet, deploys the top plan, watches it
reach Ready and stops it. The real ASGI server, Celery worker, Redis and an agent subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from io import StringIO
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from dashboard import roles
from tests.harness import end_servers_left_in, start_agent, wait_until
from tests.personas import person

pytestmark = pytest.mark.slow
MODEL = "Qwen3-VL-32B-Instruct"  # the field report's model (docs/why.md), which the demo deploys


def api_client(base_url: str, username: str, role: str, scope: str) -> httpx.Client:
    """A script's client: a personal token made with `manage.py api_token`, as the README says."""
    person(username, role)
    out = StringIO()
    call_command("api_token", username, "--scope", scope, "--days", "1", "--name", "e2e", stdout=out)
    headers = {"Authorization": f"Bearer {out.getvalue().strip()}"}
    return httpx.Client(base_url=base_url + "/api/v1", headers=headers, timeout=30)


def answer(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text[:2000]
    return response.json() if response.content else {}


@pytest.fixture
def seed_agent(live_stack, celery_worker, log_dir, tmp_path):
    """The seed node's agent, with the token an admin issued through the API."""
    with api_client(live_stack.url, "ada", roles.ADMIN, "operate") as admin:
        issued = answer(admin.post("/agent-tokens/", json={"node": "a30-seed"}), 201)
        agent = start_agent(
            live_stack.url, issued["token"], "sim:a30x4,workload=idle", log_dir, run_dir=tmp_path / "run"
        )
        yield admin
    agent.stop()
    end_servers_left_in(tmp_path / "run")


def test_it_plans_deploys_and_stops_through_the_api_with_a_token(live_stack, seed_agent):
    with api_client(live_stack.url, "olga", roles.OPERATOR, "operate") as api:
        wait_until(lambda: answer(api.get("/nodes/a30-seed/"), 200)["state"] == "online", what="agent online")
        accepted = answer(
            api.post("/plans/", json={"model": MODEL, "max_model_len": 10000, "node": "a30-seed"}), 202
        )
        plan = wait_until(lambda: done(api.get(f"/plans/{accepted['id']}/")), timeout=60, what="planning")
        assert plan["status"] == "done", plan["error"]
        assert plan["plans"] and plan["rejected"]
        top = plan["plans"][0]
        body = {"plan_request": plan["id"], "number": top["number"], "override_busy": top["needs_override"]}
        deployment = answer(api.post("/deployments/", json=body), 202)
        url = f"/deployments/{deployment['id']}/"
        ready = wait_until(
            lambda: state_in(api.get(url), "ready", "serving", "failed"), timeout=90, what="ready"
        )
        assert ready["state"] in ("ready", "serving"), ready["detail"]
        assert ready["port"] and [e["state"] for e in ready["events"]][0] == "launching"
        answer(api.post(f"{url}stop/"), 202)
        stopped = wait_until(lambda: state_in(api.get(url), "stopped"), timeout=30, what="stopped")
        assert stopped["desired"] == "stopped"
        answer(api.delete(url), 204)
        assert api.get(url).status_code == 404


def done(response: httpx.Response) -> dict | None:
    plan = answer(response, 200)
    return plan if plan["status"] in ("done", "failed") else None


def state_in(response: httpx.Response, *states: str) -> dict | None:
    deployment = answer(response, 200)
    return deployment if deployment["state"] in states else None


@pytest.mark.browser
def test_it_renders_the_docs_page_from_vendored_files_only(live_stack, browser):
    page = browser.new_page()
    outside = []
    page.on("request", lambda r: None if r.url.startswith(live_stack.url) else outside.append(r.url))
    page.goto(live_stack.url + "/api/v1/docs/")
    page.wait_for_selector(".opblock-summary-path", timeout=20000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/v1/deployments/{deployment_id}/restart/" in [p.replace("\u200b", "") for p in paths]
    assert outside == []  # no CDN: every script, style and the schema come from layercake itself


def readme_curl_steps(base_url: str) -> str:
    """The README's curl block, run as it is: only `python` and the server's address are this test's."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## REST API", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return block.replace("python manage.py", f"{sys.executable} manage.py").replace(
        "http://localhost:8000", base_url
    )


def test_it_runs_the_readmes_curl_steps(live_stack, seed_agent):
    missing = [tool for tool in ("curl", "jq") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (the README's steps use them)")
    person("alice", roles.OPERATOR)
    script = readme_curl_steps(live_stack.url)
    ran = subprocess.run(
        ["timeout", "120", "bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, **live_stack.env},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0] == '{"name":"a30-seed","state":"online"}'
    assert json.loads(lines[1])["status"] == "done" and json.loads(lines[2])["state"] in ("ready", "serving")
    assert lines[3:] == ["202", "204"]
