"""Logging in: the lockout page django-axes shows, and password-reset mails that cannot be sent in bulk."""

from __future__ import annotations

from axes.helpers import get_client_ip_address, get_client_username, get_cool_off
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import PasswordResetForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.models import RateCount


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None
) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the login page saying why it refuses and for how long."""
    cool_off = get_cool_off(request)
    context = {
        "username": get_client_username(request, credentials) or "",
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": round(cool_off.total_seconds() / 60) if cool_off else None,
    }
    return render(request, "registration/locked_out.html", context, status=429)


def over_limit(keys: list[str], limit: int, window_s: float) -> bool:
    """Count one event under each key (a window starts at a key's first event); True once any key has
    had more than `limit` events in its window. Counted in the database: every web process sees them."""
    return max(RateCount.hit(key, window_s) for key in keys) > limit


class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset view, with at most PASSWORD_RESET_LIMIT mails per address and per client address in
    PASSWORD_RESET_WINDOW_S. The count is kept whether or not the address has an account, so the refusal
    tells nothing about which addresses do."""

    def form_valid(self, form: PasswordResetForm) -> HttpResponse:
        email = form.cleaned_data["email"].strip().lower()
        keys = [f"password-reset:email:{email}", f"password-reset:ip:{get_client_ip_address(self.request)}"]
        if over_limit(keys, settings.PASSWORD_RESET_LIMIT, settings.PASSWORD_RESET_WINDOW_S):
            minutes = round(settings.PASSWORD_RESET_WINDOW_S / 60)
            form.add_error(
                "email",
                f"Too many password reset requests for this address or from your network: "
                f"no mail was sent. At most {settings.PASSWORD_RESET_LIMIT} go out per "
                f"{minutes} minutes; try again later.",
            )
            return self.form_invalid(form)
        return super().form_valid(form)
