"""Errors in OpenAI's JSON shape, `{"error": {"message", "type", "param", "code"}}`, with the status that
says whose fault it is: every way a request can be wrong maps to a 4xx here, never a traceback."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tfcli.errors import TfcliError
from tfcli.serve.protocol import WHOLE_MESSAGE

log = logging.getLogger("tfcli.serve")

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_overloaded",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def _field(loc: tuple) -> str | None:
    """The request field an error is about, as OpenAI names it ("messages[0].content"), or None."""
    parts = [p for p in loc if p != "body"]
    name = ""
    for p in parts:
        if isinstance(p, int):
            name += f"[{p}]"
        elif not str(p).startswith(("function-", "list[", "str", "int", "tagged-union", "union[", "json-or-python")):
            name += ("." if name else "") + str(p)
    return name or None


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line for the first problem pydantic found: the field and what is wrong with it."""
    errors = exc.errors()
    if not errors:
        return "the request is not valid", None
    first = errors[0]
    kind = first.get("type", "")
    field = _field(tuple(first.get("loc", ())))
    if kind == WHOLE_MESSAGE:
        return first.get("msg", "is not valid"), field
    if kind == "json_invalid":
        return f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})", None
    if kind == "extra_forbidden":
        return f"unknown field {field!r}: this server does not take it (check its spelling)", field
    if kind == "missing":
        if field is None:
            return "the request needs a JSON body", None
        return f"{field!r} is required", field
    message = first.get("msg", "is not valid")
    message = message.removeprefix("Value error, ")
    return (f"{field}: {message}" if field else message), field


def _body_not_an_object(exc: RequestValidationError) -> bool:
    """The whole body is not an object: a JSON list or string, or a body FastAPI did not parse as JSON."""
    errors = exc.errors()
    return bool(errors) and tuple(errors[0].get("loc", ())) == ("body",) and errors[0].get("type") in ("model_attributes_type", "dict_type", "model_type")


def _json_content_type(content_type: str) -> bool:
    """Whether FastAPI parses a body of this Content-Type as JSON (curl -d sends a form's; none is not parsed)."""
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def install(app: FastAPI) -> None:
    """The handlers that turn every failure into OpenAI's shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return error_response(exc.status, exc.message, exc.param, exc.code, headers)

    @app.exception_handler(TfcliError)
    async def user_error(request: Request, exc: TfcliError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if _body_not_an_object(exc):
            content_type = request.headers.get("content-type", "")
            if not _json_content_type(content_type):  # FastAPI left the body unparsed: pydantic's words would mislead
                sent = f"as {content_type!r}" if content_type else "without a Content-Type"
                return error_response(415, f"the body is sent {sent}; send a JSON object with the header 'Content-Type: application/json'")
            return error_response(400, "the body must be a JSON object ({...}), as OpenAI's API takes")
        message, param = validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        if status == 404:
            message = f"no route {request.method} {request.url.path}"
        elif status == 405:
            message = f"{request.url.path} does not take {request.method}"
        else:
            message = str(exc.detail)
        return error_response(status, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, f"the server failed on this request ({type(exc).__name__})")
