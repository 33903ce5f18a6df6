"""Issue #14 item 1.7 end to end: a real agent subprocess finds public config.json checkpoints in its
--model-dir, reports them in its hello to the real server, the deploy page offers them by name, and a plan
request for one is planned by the real Celery worker from the keys the agent sent (the server's own
MODEL_DIRS do not include the folder, so it never reads the file)."""

import os

import pytest

from dashboard.models import NodeModel
from tests.agents.test_inventory import hf_folder
from tests.e2e.test_e2e_deploy import plan_through_the_form
from tests.harness import node_with_token, start_agent, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server_env(server_env, tmp_path):
    """The server may read nothing under the agent's model folder."""
    return {**server_env, "MODEL_DIRS": os.pathsep.join([str(tmp_path / "server-only")])}


@pytest.fixture
def agent_with_models(live_stack, celery_worker, log_dir, tmp_path):
    node, token = node_with_token("a30-seed")
    for name in ("gemma-2-9b-it", "Qwen3-8B"):  # the two fixtures that are config.json files as published
        hf_folder(tmp_path / "models", name, weights=4096)
    agent = start_agent(
        live_stack.url,
        token,
        "sim:a30x4,workload=idle",
        log_dir,
        interval=0.5,
        run_dir=tmp_path / "run",
        model_dirs=(tmp_path / "models",),
    )
    wait_until(lambda: NodeModel.objects.filter(node=node).count() == 2, what="models in the agent's hello")
    yield node
    agent.stop()


def test_it_offers_and_plans_the_models_a_real_agent_reports(operator, agent_with_models, tmp_path):
    page = operator.get("/deploy/").text
    gemma = str(tmp_path / "models" / "gemma-2-9b-it")
    assert f'<option value="{gemma}">gemma-2-9b-it on a30-seed (hf, Gemma2ForCausalLM, bfloat16' in page
    row = plan_through_the_form(operator, model=gemma, max_model_len=8192)
    assert row.status == "done", row.error
    assert "reported by a30-seed's agent" in row.result["model"]["source"]
    assert row.result["model"]["layers"] == 42 and gemma in row.result["plans"][0]["command"]
