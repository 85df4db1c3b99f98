"""What every request passes before a handler sees it: the Host it names (a page that rebinds its DNS name to
this machine is refused), the API key (when the server has one), the body's size and the time it takes to
arrive. Plain ASGI middlewares: a refused request is answered at once, and its body is never kept."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json

from tfcli.errors import TfcliError
from tfcli.serve.errors import error_body

MAX_BODY_BYTES = 4 * 1024 * 1024  # a request's JSON: prompts of a long context, many times over
BODY_SECONDS = 60.0  # a body must arrive whole within this (4 MiB at 70 KB/s), else 408
DRAIN_BYTES = 64 * 1024 * 1024  # after a refusal, what the client still sends is read (and dropped) up to this
DRAIN_SECONDS = 5.0  # ... or for this long, so a client that writes its body before reading reads the answer
OPEN_PATHS = ("/",)  # the page itself: it asks for the key and sends it with every call

ANY_HOST = "*"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_BINDS = ("0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_allowed_hosts(text: str) -> frozenset[str] | None:
    """--allowed-hosts' value: host names or addresses, comma-separated, without ports; None for any (`*`).

    Example: "Models.example, [::1]" -> frozenset({"models.example", "::1"})"""
    names = set()
    for entry in text.split(","):
        name = entry.strip().lower()
        if name == ANY_HOST:
            return None
        bracketed = name.startswith("[") and name.endswith("]")
        name = name[1:-1] if bracketed else name
        if not name or any(c.isspace() or c in "/@?#[]" for c in name) or ((":" in name or bracketed) and not _is_ipv6(name)):
            raise TfcliError(
                f"--allowed-hosts takes host names or addresses without a port, separated by commas (or * for any), not {entry.strip()!r}",
                hint="for example --allowed-hosts models.example,127.0.0.1",
            )
        names.add(name)
    return frozenset(names)


def default_allowed_hosts(bind: str) -> frozenset[str] | None:
    """The Host names a server bound to `bind` answers by default (None: any). A loopback bind answers the
    loopback names (and its own address); 0.0.0.0 or :: answer any; another address answers itself."""
    name = bind.strip("[]").lower()
    if name in WILDCARD_BINDS:
        return None
    if is_loopback(name):
        return LOOPBACK_NAMES | {name}
    return frozenset({name})


def allowed_hosts(bind: str, given: str | None) -> frozenset[str] | None:
    """What a server bound to `bind` answers: --allowed-hosts when given, else the default for the bind."""
    return default_allowed_hosts(bind) if given is None else parse_allowed_hosts(given)


def host_name(value: bytes) -> str | None:
    """The name a Host header names, without its port, lower case; None when it is not a host[:port].

    Example: b"[::1]:8000" -> "::1";  b"LocalHost:8000" -> "localhost";  b"a:b:c" -> None"""
    try:
        text = value.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    if text.startswith("["):
        name, bracket, port = text[1:].partition("]")
        if not bracket or not _is_ipv6(name) or (port and not (port.startswith(":") and port[1:].isdigit())):
            return None
        return name
    name, colon, port = text.partition(":")
    if not name or ":" in port or (colon and not port.isdigit()):
        return None
    return name


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


class AllowedHosts:
    """Refuses a request whose Host header is not one of `hosts` (421), or that has none or an invalid one
    (400); `hosts` None lets every request through. A page whose DNS name was rebound to this machine sends
    its own name (Host: evil.example), so it never reaches the API behind it; the chat page, curl and the
    `openai` client send the address they were pointed at (Host: 127.0.0.1:8000)."""

    def __init__(self, app, hosts: frozenset[str] | None) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send) -> None:
        if self.hosts is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        values = [value for name, value in scope.get("headers", ()) if name == b"host"]
        name = host_name(values[0]) if len(values) == 1 else None
        if name in self.hosts:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        answered = ", ".join(sorted(f"[{h}]" if ":" in h else h for h in self.hosts))
        if name is None:
            what = "no Host header" if not values else "more than one Host header" if len(values) > 1 else "an invalid Host header"
            await refuse(receive, send, 400, f"the request has {what}; this server answers requests for {answered}", "invalid_host")
        else:
            await refuse(
                receive,
                send,
                421,
                f"this server does not answer for the host {name!r}, only for {answered} (start it with --allowed-hosts to add a name)",
                "host_not_allowed",
            )


class Limits:
    def __init__(self, app, api_key: str | None = None, max_body: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_body = app, max_body
        self.api_key = api_key.encode("utf-8") if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            await refuse(receive, send, 401, "a valid API key is required: send the header 'Authorization: Bearer KEY'", "invalid_api_key")
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:  # answered from the header, before a byte is read
            await refuse(receive, send, 413, f"the body is {declared:,} bytes; this server takes at most {self.max_body:,}", "request_too_large")
            return
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + BODY_SECONDS
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                await refuse(receive, send, 408, f"the body did not arrive within {BODY_SECONDS:g} s", "request_timeout", drain=False)
                return
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                await refuse(receive, send, 413, f"the body is over {self.max_body:,} bytes, the most this server takes", "request_too_large")
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
    """Read what the client is still sending (up to `budget` bytes) and drop it."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def refuse(receive, send, status: int, message: str, code: str, *, drain: bool = True) -> None:
    """Answer with an error in OpenAI's shape at once, and close the connection after it. The answer is sent
    whole before the body is drained (bounded by DRAIN_BYTES and DRAIN_SECONDS), then ended: a client that
    writes its whole body before reading gets to read it, and one that declared more than it sends is not
    kept waiting for its own bytes."""
    body = json.dumps(error_body(status, message, code=code)).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status in (503, 429):
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})  # all of it: content-length says so
    if drain:
        try:
            await asyncio.wait_for(_drain(receive, DRAIN_BYTES), DRAIN_SECONDS)
        except asyncio.TimeoutError:
            pass
    await send({"type": "http.response.body", "body": b"", "more_body": False})
