"""A run made ready to serve (loaded as `tfcli generate` loads it, its chat template read, the engine
started) and the uvicorn server around the app."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from pathlib import Path

from tfcli.errors import TfcliError, a_or_an
from tfcli.loader import load_run
from tfcli.serve.app import Served, create_app
from tfcli.serve.engine import Engine
from tfcli.tokenizer.chat_template import ChatTemplate
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE

MAX_BATCH = 256  # --max-batch: rows of the KV cache
MAX_QUEUE = 10_000


def check_limits(max_batch: int, max_queue: int) -> None:
    if not 1 <= max_batch <= MAX_BATCH:
        raise TfcliError(f"--max-batch must be between 1 and {MAX_BATCH}, not {max_batch}")
    if not 0 <= max_queue <= MAX_QUEUE:
        raise TfcliError(f"--max-queue must be between 0 and {MAX_QUEUE:,}, not {max_queue}")


def load_served(run: Path, *, device: str = "auto", threads: int = 0, max_batch: int = 16, max_queue: int = 64) -> Served:
    """Load a decoder run for serving and start its engine (the caller stops it: `served.engine.stop()`)."""
    check_limits(max_batch, max_queue)
    checkpoint = load_run(run, "decode", device, threads)
    config = checkpoint.model.config
    if config.arch != "decoder":
        raise TfcliError(
            f"{run} is {a_or_an(config.arch)}; tfcli serve continues text, which takes a decoder run",
            hint="generate with it instead: tfcli generate RUN --prompt TEXT",
        )
    engine = Engine(checkpoint.model, checkpoint.tokenizer, max_batch=max_batch, max_queue=max_queue)
    served = Served(name=Path(run).resolve().name, checkpoint=checkpoint, engine=engine, template=run_template(checkpoint))
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(served: Served, *, host: str, port: int, api_key: str | None, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM; the engine stops with the server."""
    import uvicorn

    app = create_app(served, api_key=api_key)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2, access_log=False)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    if on_ready is not None:
        on_ready(f"http://{shown}:{port}")
    try:
        server.run()
    finally:
        served.engine.stop()
    if not server.started:
        raise TfcliError(f"could not listen on {host}:{port}", hint="is the port in use? pick another with --port")
