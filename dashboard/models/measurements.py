"""What a deployment really did, beside what its plan predicted: the planner's fleet calibration learns from these."""

from __future__ import annotations

from typing import Any

from django.db import models

from dashboard.models.deployments import Deployment


class DeploymentMeasurement(models.Model):
    """One row per deployment: the plan's predictions, the server's startup figures and its measured decode.

    `base_*` predictions are the published calibration's (the plan's figure divided by the fleet factor it was
    planned with), so the fleet learns against a fixed reference and never from its own corrections."""

    deployment = models.OneToOneField(
        Deployment, primary_key=True, on_delete=models.CASCADE, related_name="measurement"
    )
    updated = models.DateTimeField(auto_now=True)
    # the calibration key (placement.calibration.FleetKey)
    gpu_model = models.CharField(max_length=100, blank=True)
    backend = models.CharField(max_length=20, blank=True)
    link_class = models.CharField(max_length=20, blank=True)
    fleet_factor = models.FloatField(default=1.0, help_text="the fleet factor the plan was made with")
    # predicted
    planned_streams = models.PositiveIntegerField(null=True, blank=True)
    predicted_weights_gib = models.FloatField(null=True, blank=True)
    predicted_kv_tokens = models.BigIntegerField(null=True, blank=True)
    predicted_stream_tok_s = models.FloatField(null=True, blank=True)
    predicted_single_tok_s = models.FloatField(null=True, blank=True)
    # measured: startup lines
    weights_gib = models.FloatField(null=True, blank=True)
    kv_tokens = models.BigIntegerField(null=True, blank=True)
    kv_cache_gib = models.FloatField(null=True, blank=True)
    max_concurrency = models.FloatField(null=True, blank=True)
    # measured: metrics while decoding
    streams = models.FloatField(null=True, blank=True, help_text="median requests running while decoding")
    stream_tok_s = models.FloatField(null=True, blank=True, help_text="median tokens/s per stream")
    total_tok_s = models.FloatField(null=True, blank=True, help_text="median tokens/s over all streams")
    decode_intervals = models.PositiveIntegerField(
        default=0, help_text="metric intervals the decode figures use"
    )

    class Meta:
        indexes = [models.Index(fields=["gpu_model", "backend", "link_class"], name="measurement_key")]

    def __str__(self) -> str:
        return f"measurement of {self.deployment_id}"

    @property
    def compared_stream_tok_s(self) -> float | None:
        """The prediction the measured per-stream rate is compared with: single-stream when it ran one stream
        at a time, else the plan's per-stream figure at its concurrency."""
        if self.streams is not None and self.streams < 1.5:
            return self.predicted_single_tok_s
        return self.predicted_stream_tok_s

    @property
    def decode_ratio(self) -> float | None:
        """Measured over predicted decode per stream (None until both exist)."""
        predicted = self.compared_stream_tok_s
        if not predicted or self.stream_tok_s is None or self.decode_intervals == 0:
            return None
        return self.stream_tok_s / predicted

    @property
    def base_decode_ratio(self) -> float | None:
        """Measured over the published calibration's prediction: what the fleet calibration learns from."""
        ratio = self.decode_ratio
        return None if ratio is None else ratio * self.fleet_factor

    def comparison(self) -> list[dict[str, Any]]:
        """Predicted against measured, one row per quantity, for the deployment page and the API."""
        rows = [
            ("weights per GPU (GiB)", self.predicted_weights_gib, self.weights_gib),
            ("KV cache (tokens)", self.predicted_kv_tokens, self.kv_tokens),
            ("decode per stream (tok/s)", self.compared_stream_tok_s, self.stream_tok_s),
        ]
        return [
            {
                "quantity": name,
                "predicted": predicted,
                "measured": measured,
                "ratio": measured / predicted if predicted and measured is not None else None,
            }
            for name, predicted, measured in rows
        ]
