"""Placement planner: which backend, TP/PP and GPUs to run a model on, and why.

Pure library (no Django). Entry points:
    load_model(ref) -> ModelSpec           catalog name / HF id, config.json (or folder), .gguf file
    load_cluster(obj_or_path) -> Cluster   the fleet JSON (topology as text or parsed object)
    plan(model, cluster, request) -> PlanResult          ranked plans + rejected configurations
    check_command(argv, cluster, visible) -> CheckResult  an operator's own command line
Bad input raises PlacementError (a ValueError) naming what is wrong.
"""

from __future__ import annotations

from placement.check import CheckResult, check_command
from placement.cluster import Cluster, load_cluster
from placement.errors import PlacementError
from placement.plans import plan
from placement.request import Request
from placement.result import PlanResult
from placement.spec import ModelSpec, load_model

__all__ = [
    "CheckResult",
    "Cluster",
    "ModelSpec",
    "PlacementError",
    "PlanResult",
    "Request",
    "check_command",
    "load_cluster",
    "load_model",
    "plan",
]
