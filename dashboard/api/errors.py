"""Every API error has one shape: {"error": {"code", "message", "field"}}, whatever raised it."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "not_allowed"}


class ApiError(Exception):
    """A request the API refuses, with the status, a stable code and the field at fault (if one is)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def install(api: NinjaAPI) -> None:
    """Put the handlers on `api`: each turns an exception into the one error shape."""

    def respond(request: HttpRequest, status: int, payload: dict[str, Any]) -> HttpResponse:
        return api.create_response(request, payload, status=status)

    @api.exception_handler(ApiError)
    def refused(request: HttpRequest, exc: ApiError) -> HttpResponse:
        return respond(request, exc.status, body(exc.code, exc.message, exc.field))

    @api.exception_handler(ValidationError)
    def invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        return respond(request, 422, validation_body(exc.errors))

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        message = (
            str(exc) if str(exc) != "Unauthorized" else "log in, or send Authorization: Bearer <API token>"
        )
        return respond(request, 401, body("unauthorized", message))

    @api.exception_handler(PermissionDenied)
    def forbidden(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
        return respond(request, 403, body("forbidden", str(exc) or "forbidden"))

    @api.exception_handler(Http404)
    def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return respond(request, 404, body("not_found", str(exc) or "no such object"))

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        return respond(request, exc.status_code, body(CODES.get(exc.status_code, "error"), str(exc)))


def validation_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The first problem pydantic found, naming the field (the request part, e.g. "body", is left out)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "payload")]
    if first.get("type") == "json_invalid":
        return body("invalid", "the request body is not valid JSON")
    return body("invalid", str(first.get("msg", "invalid")), ".".join(loc) or None)
