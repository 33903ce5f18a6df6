"""Who is calling the API and what they may do: a personal API token (scripts) or the browser's session.

A token acts as its user: the role decides as in the UI (`roles.check`), and a `read` token is refused every
change before the role is even asked. A refused token gets 401 with the reason; nothing runs for it.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from ninja.errors import AuthenticationError
from ninja.security import HttpBearer, SessionAuth

from dashboard import roles
from dashboard.models import ApiToken
from dashboard.models.api_tokens import TokenRefused


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer lcu_...`: a personal API token."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        try:
            row = ApiToken.verify(token)
        except TokenRefused as exc:
            raise AuthenticationError(message=str(exc)) from None
        request.user = row.user
        request.api_token = row
        return row.user


AUTH = [ApiTokenAuth(), SessionAuth()]


def permit(request: HttpRequest, ability: roles.Ability) -> None:
    """Raise PermissionDenied (403) unless the caller may do this: a token needs the operate scope, and the
    user the role the UI asks for."""
    token: ApiToken | None = getattr(request, "api_token", None)
    if token is not None and not token.may_operate:
        raise PermissionDenied(
            f"this API token has the read scope; to {ability.doing}, use a token with the operate scope"
        )
    roles.check(request.user, ability)
