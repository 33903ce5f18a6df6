"""Asking a deployment's server through its agent: "Try it" and "Measure" on the deployment page.

The browser sends `{"type": "ask", ...}` on its live socket; `start_ask` checks the role and the deployment,
builds the agent command (agents.protocol.Ask) and, for a measurement, the row the result lands in. The
agent's `answer` frames come back to `record_answer` (a measurement's result) and on to that browser only.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import ValidationError

from agents import protocol
from dashboard import roles
from dashboard.choices import DeploymentState
from dashboard.models import Deployment, DeploymentLoadTest

ASKABLE = (DeploymentState.READY, DeploymentState.SERVING)
MEASURE_PROMPT = "Write a short story about a GPU cluster that learns to plan its own work."
ASK_FIELDS = ("prompt", "max_tokens", "streams", "measure")


class AskRefused(ValueError):
    """A browser's ask that cannot be sent: the message says what is wrong."""


def ask_group(request: str) -> str:
    """The channel-layer group of the browser that made `request`."""
    return f"ask.{request}"


def start_ask(user: Any, data: dict) -> tuple[int, str, str]:
    """(the node to send it to, the agent command, the request id) for a browser's ask."""
    roles.check(user, roles.CONTROL)
    deployment = Deployment.objects.filter(pk=str(data.get("deployment", ""))[:64]).first()
    if deployment is None:
        raise AskRefused(f"no deployment {str(data.get('deployment'))[:64]!r}")
    if deployment.state not in ASKABLE:
        raise AskRefused(
            f"{deployment.name} is {deployment.state_label().lower()}: only a ready or serving one answers"
        )
    fields = {k: data[k] for k in ASK_FIELDS if k in data}
    if fields.get("measure") and not fields.get("prompt"):
        fields["prompt"] = MEASURE_PROMPT
    request = uuid.uuid4().hex
    try:
        ask = protocol.Ask(
            type="ask", v=protocol.VERSION, deployment=deployment.pk, request=request, **fields
        )
    except (ValidationError, TypeError) as exc:
        raise AskRefused(_first_error(exc)) from None
    if ask.measure:
        _measurement_row(deployment, ask, user)
    return deployment.node_id, protocol.dump(ask), request


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc']) or 'ask'}: {first['msg']}"
    return str(exc)


def _measurement_row(deployment: Deployment, ask: protocol.Ask, user: Any) -> DeploymentLoadTest:
    return DeploymentLoadTest.objects.create(
        deployment=deployment,
        request=ask.request,
        created_by=user if getattr(user, "is_authenticated", False) else None,
        streams=ask.streams,
        max_tokens=ask.max_tokens,
        backend=deployment.launch.get("backend", ""),
        predicted_tok_s=deployment.chosen_plan.decode_tok_s,
    )


def record_answer(node_id: int, answer: protocol.Answer) -> DeploymentLoadTest | None:
    """Store a measurement's result, only for a measurement this server asked that node for."""
    if not answer.done or answer.measurement is None:
        return None
    row = DeploymentLoadTest.objects.filter(
        request=answer.request,
        deployment_id=answer.deployment,
        deployment__node_id=node_id,
        status=DeploymentLoadTest.RUNNING,
    ).first()
    if row is not None:
        row.record(answer.measurement, answer.error)
    return row


def browser_event(answer: protocol.Answer) -> dict:
    """What the asking browser gets of an answer frame (through the channel layer)."""
    return {**answer.model_dump(mode="json", exclude={"v"}), "type": "fleet.answer"}
