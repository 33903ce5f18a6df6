from __future__ import annotations

import json
import re
from typing import Any

from django import forms

from dashboard.models import Alert, Node, PlanRequest
from dashboard.node_models import model_options
from placement import PlacementError
from placement.request import parse_version

BACKENDS = [
    ("", "any"),
    ("vllm", "vLLM"),
    ("sglang", "SGLang"),
    ("llama.cpp", "llama.cpp"),
    ("ollama", "Ollama"),
]


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON number")


class DeployForm(forms.Form):
    model = forms.CharField(
        max_length=500,
        required=False,
        label="Model",
        help_text="a model an agent found in its --model-dir (offered by name), a catalog name "
        "(Qwen3-VL-32B-Instruct), an HF id, or a path to a config.json / GGUF under the server's model "
        "directories (MODEL_DIRS), the same path on the node",
    )
    config = forms.FileField(required=False, label="or upload config.json")
    max_model_len = forms.IntegerField(min_value=16, max_value=10_000_000, initial=8192, label="Max context")
    concurrency = forms.IntegerField(min_value=1, max_value=4096, initial=1, label="Expected concurrency")
    node = forms.ModelChoiceField(
        Node.objects.all(), required=False, empty_label="any node", to_field_name="name"
    )
    backend = forms.ChoiceField(choices=BACKENDS, required=False)
    gpus = forms.CharField(max_length=200, required=False, label="GPUs", help_text="e.g. 0,1 (optional)")
    tp = forms.IntegerField(
        min_value=1,
        max_value=64,
        required=False,
        label="Tensor parallel",
        help_text="1 = no tensor parallelism (pipeline / layer split only); empty = any",
    )
    backend_version = forms.CharField(
        max_length=40,
        required=False,
        label="vLLM version",
        help_text="e.g. 0.7.3: plans with the non-torch memory that release's profiler counts; empty = the "
        "release the nodes' agents reported, else the pessimistic default",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model"].widget.attrs["list"] = "model-options"
        self.model_options = model_options()

    def clean_gpus(self) -> str:
        value = self.cleaned_data["gpus"].replace(" ", "")
        if value and not re.fullmatch(r"\d{1,3}(,\d{1,3})*", value):
            raise forms.ValidationError("GPUs are indices separated by commas, e.g. 0,1,2,3")
        return value

    def clean_backend_version(self) -> str:
        value = self.cleaned_data["backend_version"].strip()
        if value:
            try:
                parse_version(value)
            except PlacementError as exc:
                raise forms.ValidationError(str(exc)) from None
        return value

    def clean_config(self) -> dict | None:
        upload = self.cleaned_data.get("config")
        if upload is None:
            return None
        if upload.size > 2_000_000:
            raise forms.ValidationError("config.json is larger than 2 MB; is it really a config.json?")
        try:
            data = json.loads(upload.read(), parse_constant=_not_json)
        except (ValueError, UnicodeDecodeError) as exc:
            raise forms.ValidationError(f"config.json is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise forms.ValidationError("config.json must be a JSON object")
        return data

    def clean(self) -> dict:
        data = super().clean()
        if not data.get("model") and not data.get("config"):
            raise forms.ValidationError("give a model name or path, or upload its config.json")
        if data.get("config") and not data.get("model"):
            data["model"] = str(data["config"].get("_name_or_path") or "uploaded-model")
        return data

    def save(self, user: Any) -> PlanRequest:
        """The plan request of a valid form (the deploy page, an alert's re-plan); the caller queues planning."""
        d = self.cleaned_data
        return PlanRequest.objects.create(
            created_by=user,
            model_ref=d["model"],
            config=d["config"],
            max_model_len=d["max_model_len"],
            concurrency=d["concurrency"],
            node=d["node"],
            backend=d["backend"],
            gpus=d["gpus"],
            tp=d["tp"],
            backend_version=d["backend_version"],
        )

    def problems(self) -> str:
        return "; ".join(f"{name}: {' '.join(errors)}" for name, errors in self.errors.items())


def replan_request(alert: Alert, user: Any) -> PlanRequest:
    """Turn the alert's re-plan suggestion into a plan request, checked like the deploy form checks one."""
    fields = alert.replan_fields()
    if not fields:
        raise ValueError(f"alert {alert.pk} offers no re-plan")
    form = DeployForm(
        data={
            "model": fields.get("model_ref", ""),
            "max_model_len": fields.get("max_model_len"),
            "concurrency": fields.get("concurrency", 1),
            "node": fields.get("node") or "",
            "backend": fields.get("backend") or "",
            "gpus": fields.get("gpus") or "",
            "tp": fields.get("tp") or "",
        }
    )
    if not form.is_valid():
        raise ValueError(
            f"the re-plan suggestion of alert {alert.pk} is not a valid request: {form.problems()}"
        )
    return form.save(user)
