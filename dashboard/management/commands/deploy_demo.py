"""`python manage.py deploy_demo`: plan the field report's model on the demo's 4x A30 node and deploy the
best plan (on a simulated node it runs on the simulated backend at the predicted rate)."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from dashboard import deploy, tasks
from dashboard.choices import DeploymentState, PlanStatus
from dashboard.models import Node, PlanRequest


class Command(BaseCommand):
    help = "Deploy the demo model on the demo fleet (waits for the node's agent first)."

    def add_arguments(self, parser):
        parser.add_argument("--node", default="a30-seed")
        parser.add_argument("--model", default="Qwen3-VL-32B-Instruct")
        parser.add_argument("--max-model-len", type=int, default=10000)
        parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the node's agent")

    def handle(self, node: str, model: str, max_model_len: int, wait: float, **options):
        target = self.wait_for_node(node, wait)
        running = target.deployments.filter(name=model, state__in=DeploymentState.ACTIVE).first()
        if running is not None:  # a rerun of ./run.sh: its agent re-attaches to the server it already runs
            self.stdout.write(f"demo deployment {running.pk}: {model} already {running.state} on {node}")
            return
        row = PlanRequest.objects.create(
            model_ref=model, max_model_len=max_model_len, concurrency=4, node=target
        )
        row = deploy.run_plan_request(row.pk)
        if row.status != PlanStatus.DONE or not row.plans():
            raise CommandError(f"could not plan {model} on {node}: {row.error or 'no plan fits'}")
        deployment = deploy.create_deployment(row, 0, None)
        tasks.launch_deployment.delay(deployment.pk)
        plan = deployment.chosen_plan
        self.stdout.write(
            f"demo deployment {deployment.pk}: {model} as {plan.backend} TP={plan.tp} "
            f"PP={plan.pp} on {node} (runs as {deployment.launch['backend']})"
        )

    def wait_for_node(self, name: str, wait: float) -> Node:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            node = Node.objects.filter(name=name).first()
            if node is not None and node.gpus.exists():
                return node
            time.sleep(0.5)
        raise CommandError(f"node {name} did not report its GPUs within {wait} s")
