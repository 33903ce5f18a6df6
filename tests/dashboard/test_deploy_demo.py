from io import StringIO

import pytest
from django.core.management import call_command

from dashboard.choices import DeploymentState
from dashboard.models import Deployment
from dashboard.tasks import launch_deployment
from tests.personas import seed_server

pytestmark = pytest.mark.django_db


def test_it_deploys_the_seed_model_once_however_often_the_demo_starts(monkeypatch):
    seed_server()
    queued = []
    monkeypatch.setattr(launch_deployment, "delay", queued.append)
    first, second = StringIO(), StringIO()
    call_command("deploy_demo", stdout=first)
    Deployment.objects.update(state=DeploymentState.SERVING)
    call_command("deploy_demo", stdout=second)
    assert "as vllm TP=1 PP=4 on a30-seed (runs as simulated)" in first.getvalue()
    assert "already serving" in second.getvalue()
    assert Deployment.objects.count() == 1 and len(queued) == 1
