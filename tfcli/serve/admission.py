"""What every request passes before a handler sees it: the API key (when the server has one) and the body's
size. A plain ASGI middleware, so that a body over the limit is refused (413) without being kept."""

from __future__ import annotations

import hmac
import json

from tfcli.serve.errors import error_body

MAX_BODY_BYTES = 4 * 1024 * 1024  # a request's JSON: prompts of a long context, many times over
DRAIN_BYTES = 64 * 1024 * 1024  # a body over the limit is read (and dropped) up to this, so the client reads the 413
OPEN_PATHS = ("/",)  # the page itself: it asks for the key and sends it with every call


class Limits:
    def __init__(self, app, api_key: str | None = None, max_body: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_body = app, max_body
        self.api_key = api_key.encode("utf-8") if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            await _drain(receive, DRAIN_BYTES)
            await _reply(send, 401, "a valid API key is required: send the header 'Authorization: Bearer KEY'", "invalid_api_key")
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await _drain(receive, DRAIN_BYTES)
            await _reply(send, 413, f"the body is {declared:,} bytes; this server takes at most {self.max_body:,}", "request_too_large")
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                await _drain(receive, DRAIN_BYTES - size)
                await _reply(send, 413, f"the body is over {self.max_body:,} bytes, the most this server takes", "request_too_large")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # later: the client's disconnect

        await self.app(scope, replay, send)

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)
        return False


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive, budget: int) -> None:
    """Read what the client is still sending (up to `budget` bytes) so that it gets to read the answer."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _reply(send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
