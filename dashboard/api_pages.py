"""The API's pages: the user's personal API tokens (create, shown once; revoke), the interactive docs page,
and the JSON 404 for a path under /api/v1/ that names no operation."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render

from dashboard import roles
from dashboard.models import ApiToken
from dashboard.models.api_tokens import MAX_DAYS, SCOPES


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, label="What it is for", help_text="e.g. nightly deploy script")
    scope = forms.ChoiceField(choices=SCOPES, initial="read")
    days = forms.IntegerField(min_value=1, max_value=MAX_DAYS, initial=90, label="Expires after (days)")


@login_required
def api_tokens_page(request: HttpRequest) -> HttpResponse:
    form = ApiTokenForm(request.POST if request.POST.get("action") == "create" else None)
    plaintext = None
    if request.method == "POST" and request.POST.get("action") == "revoke":
        return revoke(request)
    if form.is_valid():
        _, plaintext = ApiToken.issue(request.user, **form.cleaned_data)
        form = ApiTokenForm()
    tokens = ApiToken.objects.filter(user=request.user)
    context = {"form": form, "tokens": tokens, "new_token": plaintext, "role": roles.role_of(request.user)}
    return render(request, "dashboard/api_tokens.html", context)


def revoke(request: HttpRequest) -> HttpResponse:
    pk = request.POST.get("token", "")
    row = get_object_or_404(ApiToken, pk=int(pk) if pk.isdigit() else 0, user=request.user)
    row.revoke()
    messages.info(request, f"Token {row.prefix}… ({row.name}) is revoked.")
    return redirect("api-tokens")


def api_not_found(request: HttpRequest, rest: str) -> HttpResponse:
    """Under /api/v1/ even a path that matches no operation answers in the API's error shape."""
    message = f"no API operation at {request.path}; the operations are listed at /api/v1/schema/"
    return JsonResponse({"error": {"code": "not_found", "message": message, "field": None}}, status=404)


def api_docs(request: HttpRequest) -> HttpResponse:
    """Swagger UI over /api/v1/schema/, from the vendored files (no CDN); "Try it out" uses the session."""
    return render(request, "dashboard/api_docs.html")
