"""Asking a deployment's server through its agent, server side: who may, what is refused, what is stored."""

import json

import pytest
from django.core.exceptions import PermissionDenied

from agents import protocol
from dashboard import asking
from dashboard.choices import DeploymentState
from dashboard.models import Deployment, DeploymentLoadTest
from tests.dashboard.test_ux_pages import running_on
from tests.personas import sim_node, viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def serving():
    return running_on(sim_node("rtx4090-box", "sim:rtx4090x2"), [0])


def answer(request: str, node_id: int, deployment: str = "d1", **m) -> DeploymentLoadTest | None:
    result = {"streams": 4, "completed": 4, "tokens": 256, "seconds": 2.5, "tok_s_per_stream": 31.0, **m}
    frame = protocol.Answer(
        type="answer", v=1, deployment=deployment, request=request, done=True, measurement=result
    )
    return asking.record_answer(node_id, frame)


def test_it_builds_the_agent_command_and_a_measurement_row_beside_the_prediction(alice, serving):
    node_id, frame, request = asking.start_ask(alice, {"deployment": "d1", "measure": True, "streams": 4})
    command = protocol.parse_server_command(frame)
    assert (node_id, command.streams, command.measure, command.request) == (serving.node_id, 4, True, request)
    assert command.prompt == asking.MEASURE_PROMPT
    row = DeploymentLoadTest.objects.get(request=request)
    assert (row.status, row.streams, row.predicted_tok_s, row.created_by) == ("running", 4, 40.0, alice)
    stored = answer(request, serving.node_id)
    assert (stored.status, stored.tok_s_per_stream, stored.tokens) == ("done", 31.0, 256)
    assert stored.ratio_to_prediction() == pytest.approx(31 / 40)


def test_it_stores_a_result_only_from_the_node_that_was_asked_and_only_once(alice, serving):
    _, _, request = asking.start_ask(alice, {"deployment": "d1", "measure": True, "streams": 2})
    assert answer(request, serving.node_id + 1) is None
    assert answer("f" * 32, serving.node_id) is None
    assert answer(request, serving.node_id, tok_s_per_stream=5.0).tok_s_per_stream == 5.0
    assert answer(request, serving.node_id, tok_s_per_stream=99.0) is None
    assert DeploymentLoadTest.objects.get(request=request).tok_s_per_stream == 5.0


def test_it_records_a_measurement_where_no_stream_finished_as_failed(alice, serving):
    _, _, request = asking.start_ask(alice, {"deployment": "d1", "measure": True})
    frame = protocol.Answer(
        type="answer",
        v=1,
        deployment="d1",
        request=request,
        done=True,
        error="TimeoutError: timed out",
        measurement={"streams": 4, "completed": 0, "tokens": 0, "seconds": 120},
    )
    row = asking.record_answer(serving.node_id, frame)
    assert (row.status, row.error, row.tok_s_per_stream) == ("failed", "TimeoutError: timed out", None)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"deployment": "nope", "prompt": "hi"}, "no deployment 'nope'"),
        ({"deployment": "d1", "prompt": ""}, "prompt"),
        ({"deployment": "d1", "prompt": "hi", "streams": 0}, "streams"),
        ({"deployment": "d1", "prompt": "hi", "max_tokens": "lots"}, "max_tokens"),
        ({"deployment": "d1", "prompt": "hi", "argv": ["rm"]}, ""),
    ],
)
def test_it_refuses_a_bad_ask_saying_what_is_wrong_and_stores_nothing(alice, serving, data, message):
    if "argv" in data:  # fields the protocol does not know are not passed on
        node_id, frame, _ = asking.start_ask(alice, data)
        assert "argv" not in json.loads(frame)
        return
    with pytest.raises(asking.AskRefused, match=message):
        asking.start_ask(alice, data)
    assert not DeploymentLoadTest.objects.exists()


def test_it_refuses_a_deployment_that_is_not_serving_and_a_viewer(alice, serving):
    Deployment.objects.filter(pk="d1").update(state=DeploymentState.LOADING)
    with pytest.raises(asking.AskRefused, match="is loading: only a ready or serving one answers"):
        asking.start_ask(alice, {"deployment": "d1", "prompt": "hi"})
    with pytest.raises(PermissionDenied, match="needs the operator role"):
        asking.start_ask(viewer(), {"deployment": "d1", "prompt": "hi"})
