"""A run made ready to serve (loaded as `tfcli generate` loads it, its chat template read, the engine
started) and the uvicorn server around the app: its socket bound before anything is loaded, and every
connection bounded in time and number."""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

import h11

from tfcli.errors import TfcliError, a_or_an
from tfcli.loader import load_run
from tfcli.serve.admission import AllowedHosts, refuse
from tfcli.serve.app import Served, create_app, model_names
from tfcli.serve.engine import Engine
from tfcli.tokenizer.chat_template import ChatTemplate
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE

MAX_BATCH = 256  # --max-batch: rows of the KV cache
MAX_QUEUE = 10_000
KEEP_ALIVE_SECONDS = 5  # a kept-alive connection with no new request is closed after this
HEAD_SECONDS = 10.0  # a request's line and headers must arrive whole within this (of the connection's start or the last answer)
CONNECTION_ROOM = 32  # connections beyond the engine's rows and queue (the page, /health, idle kept-alive clients)


def check_limits(max_batch: int, max_queue: int) -> None:
    if not 1 <= max_batch <= MAX_BATCH:
        raise TfcliError(f"--max-batch must be between 1 and {MAX_BATCH}, not {max_batch}")
    if not 0 <= max_queue <= MAX_QUEUE:
        raise TfcliError(f"--max-queue must be between 0 and {MAX_QUEUE:,}, not {max_queue}")


def load_served(
    run: Path, *, device: str = "auto", threads: int = 0, max_batch: int = 16, max_queue: int = 64, served_model_names: Sequence[str] = ()
) -> Served:
    """Load a decoder run for serving and start its engine (the caller stops it: `served.engine.stop()`)."""
    check_limits(max_batch, max_queue)
    names = model_names(run, served_model_names)
    checkpoint = load_run(run, "decode", device, threads)
    config = checkpoint.model.config
    if config.arch != "decoder":
        raise TfcliError(
            f"{run} is {a_or_an(config.arch)}; tfcli serve continues text, which takes a decoder run",
            hint="generate with it instead: tfcli generate RUN --prompt TEXT",
        )
    engine = Engine(checkpoint.model, checkpoint.tokenizer, max_batch=max_batch, max_queue=max_queue)
    served = Served(name=names[0], names=names, checkpoint=checkpoint, engine=engine, template=run_template(checkpoint))
    engine.start()
    return served


def run_template(checkpoint) -> ChatTemplate | None:
    """The run's chat template, or None (its chat route then says it has none)."""
    path = Path(checkpoint.path) / TOKENIZER_CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise TfcliError(f"cannot read {path}: {exc}") from exc
    return ChatTemplate.for_tokenizer(checkpoint.tokenizer, config if isinstance(config, dict) else {}, str(checkpoint.path))


def connection_limit(max_batch: int, max_queue: int) -> int:
    """Connections served at once (uvicorn's limit_concurrency): the engine's rows and queue and some room; a
    request on a connection past it is answered 503 at once, as a full queue is."""
    return max_batch + max_queue + CONNECTION_ROOM


def bind(host: str, port: int) -> socket.socket:
    """The server's socket, bound (uvicorn listens on it), or one line saying why it cannot be: checked before
    the run is loaded, so a mistyped --host or a port in use is told at once."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # proto named, as getaddrinfo names it when uvicorn binds: asyncio sets TCP_NODELAY on a connection only when
    # its socket says IPPROTO_TCP, and without it each small answer on a kept-alive connection waited ~40 ms for
    # a delayed ACK (Nagle)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except socket.gaierror:
        sock.close()
        raise TfcliError(
            f"cannot listen on {where}: {host!r} is not an address, or a name this machine resolves",
            hint="pass --host 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)",
        ) from None
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise TfcliError(f"cannot listen on {where}: the port is in use", hint="stop what listens there, or pick another with --port") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise TfcliError(
                f"cannot listen on {where}: {host} is not an address of this machine", hint="pass one of its addresses, or 0.0.0.0 for all of them"
            ) from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise TfcliError(f"cannot listen on {where}: permission denied", hint="ports under 1024 need privileges: pick another with --port") from None
        raise TfcliError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _bounded_h11(head_seconds: float, limit: int) -> type:
    """uvicorn's h11 protocol with the two bounds it lacks. A request's head must arrive whole within
    `head_seconds` of the connection's start or of the last answer, else the connection is closed (uvicorn's
    keep-alive timer starts only after a first answer and stops at any byte, so a client that sent half a
    request line would hold its connection for ever). And a request on a connection past `limit` is answered
    503 in OpenAI's shape (uvicorn's own limit_concurrency answers in plain text)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency, self.head_timer, inner = None, None, self.app

            async def app(scope, receive, send) -> None:
                if len(self.connections) > limit or len(self.tasks) > limit:
                    await refuse(receive, send, 503, f"the server is busy: more than {limit} connections; try again shortly", "server_busy")
                else:
                    await inner(scope, receive, send)

            self.app = app

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            self.head_timer = None if self.transport.is_closing() else self.loop.call_later(head_seconds, self._head_due)

        def _head_due(self) -> None:
            self.head_timer = None
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE:  # no request's head came whole since the timer started
                self.transport.close()
            else:  # a request is under way: look again later
                self._arm_head_timer()

    return BoundedH11


def make_server(served: Served, *, api_key: str | None, allowed_hosts: frozenset[str] | None, head_seconds: float = HEAD_SECONDS):
    """The uvicorn server of the app, behind the Host check (run it with `server.run(sockets=[bind(...)])`)."""
    import uvicorn

    limit = connection_limit(served.engine.max_batch, served.engine.max_queue)
    app = AllowedHosts(create_app(served, api_key=api_key), allowed_hosts)
    config = uvicorn.Config(
        app,
        http=_bounded_h11(head_seconds, limit),
        limit_concurrency=limit,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        log_level="warning",
        timeout_graceful_shutdown=2,
        access_log=False,
    )
    return uvicorn.Server(config)


def serve(
    served: Served,
    sock: socket.socket,
    *,
    api_key: str | None,
    allowed_hosts: frozenset[str] | None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve on `sock` (from `bind`) until Ctrl-C or SIGTERM; the engine stops with the server."""
    host, port = sock.getsockname()[:2]
    server = make_server(served, api_key=api_key, allowed_hosts=allowed_hosts)
    shown = f"[{host}]" if ":" in host else host
    if on_ready is not None:
        on_ready(f"http://{shown}:{port}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        served.engine.stop()
    if not server.started:
        raise TfcliError(f"could not serve on {shown}:{port}", hint="see the message above")
