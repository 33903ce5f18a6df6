"""Alert pages: the list, one alert with its evidence and history, the banner fragment, my channels."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard import alerts, browser_json, egress, roles, tasks
from dashboard.choices import AlertStatus, ChannelKind
from dashboard.context_processors import banner_context
from dashboard.forms import replan_request
from dashboard.models import Alert, Channel
from dashboard.transports import shows_raw_errors

RECENT_RESOLVED = 50
# Evidence keys the detail page draws in their own sections; the rest are listed as facts.
DRAWN_EVIDENCE = ("log", "series", "log_findings", "nodes")


class WebhookForm(forms.Form):
    url = forms.URLField(
        max_length=500,
        assume_scheme="https",
        label="Webhook URL",
        help_text="receives a JSON POST for every open, acknowledge and resolve",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        if not url.startswith(("http://", "https://")):
            raise forms.ValidationError("the webhook URL must start with http:// or https://")
        target = urlsplit(url)
        try:
            egress.checked_addresses(
                target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
            )
        except egress.AddressRefused as exc:
            raise forms.ValidationError(exc.detail if shows_raw_errors(self.user) else exc.public) from None
        except ValueError:  # a port out of range
            raise forms.ValidationError("the webhook URL's port must be 1-65535") from None
        return url


@login_required
def alerts_page(request: HttpRequest) -> HttpResponse:
    resolved = Alert.objects.filter(status=AlertStatus.RESOLVED).select_related("deployment", "node")
    context = {
        "unresolved": alerts.open_alerts(),
        "resolved": resolved.order_by("-resolved")[:RECENT_RESOLVED],
        "disabled": Channel.objects.filter(enabled=False).exclude(disabled_reason="").select_related("owner"),
    }
    return render(request, "dashboard/alerts.html", context)


@login_required
def alert_page(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(Alert.objects.select_related("deployment", "node", "acknowledged_by"), pk=pk)
    evidence = alert.evidence or {}
    context = {
        "alert": alert,
        "events": alert.events.all(),
        "series": evidence.get("series"),
        "findings": evidence.get("log_findings", []),
        "facts": evidence_facts(evidence),
        "notifications": alert.notifications.select_related("channel", "event")[:50],
    }
    return render(request, "dashboard/alert.html", context)


def evidence_facts(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (name.replace("_", " "), value if isinstance(value, str) else browser_json.dumps(value))
        for name, value in evidence.items()
        if name not in DRAWN_EVIDENCE
    ]


@login_required
@require_POST
@roles.requires(roles.ACKNOWLEDGE)
def alert_acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    alert, batch = get_object_or_404(Alert, pk=pk), alerts.Batch()
    if alerts.acknowledge(alert, request.user, batch) is None:
        messages.info(request, f"This alert is {alert.status_label().lower()} already.")
    tasks.enqueue(batch.jobs())
    return redirect(alert)


@login_required
@require_POST
@roles.requires(roles.PLAN)
def alert_replan(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(Alert, pk=pk)
    try:
        row = replan_request(alert, request.user)
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect(alert)
    tasks.plan_request.delay(row.pk)
    return redirect(row)


@login_required
def alert_banner(request: HttpRequest) -> HttpResponse:
    """The banner alone, fetched by the page script whenever an alert changes."""
    return render(request, "dashboard/_alert_banner.html", banner_context())


@login_required
def alert_settings(request: HttpRequest) -> HttpResponse:
    Channel.ensure_operator_emails()
    form = WebhookForm(request.POST if request.POST.get("action") == "add" else None, user=request.user)
    if request.method == "POST" and change_channels(request, form):
        return redirect("alert-settings")
    channels = Channel.objects.filter(owner=request.user)
    return render(request, "dashboard/alert_settings.html", {"channels": channels, "form": form})


def change_channels(request: HttpRequest, form: WebhookForm) -> bool:
    """Apply one settings action (add, enable, disable, delete); False to show the form's errors. Anyone may
    turn their own mail off and on; webhooks need the webhooks ability."""
    action = request.POST.get("action")
    if action == "add":
        roles.check(request.user, roles.WEBHOOKS)
        if not form.is_valid():
            return False
        Channel.objects.get_or_create(
            owner=request.user, kind=ChannelKind.WEBHOOK, value=form.cleaned_data["url"]
        )
        return True
    pk = request.POST.get("channel", "")
    channel = get_object_or_404(Channel, pk=int(pk) if pk.isdigit() else 0, owner=request.user)
    if channel.kind == ChannelKind.WEBHOOK:
        roles.check(request.user, roles.WEBHOOKS)
    if action == "enable":
        channel.enable()
    elif action == "disable":
        channel.disable("")  # the operator's own choice: no error to show anyone
    elif action == "delete" and channel.kind == ChannelKind.WEBHOOK:
        channel.delete()
    else:
        messages.error(request, f"unknown action {action!r} for a {channel.kind} channel")
    return True
