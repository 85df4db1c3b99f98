"""`tfcli serve RUN`: the run behind an OpenAI-compatible API and a chat page (tfcli.serve)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tfcli.cli.common import stderr_console
from tfcli.cli.options import DecoderRun, Device, Threads

ApiKey = Annotated[
    Optional[str],
    typer.Option(
        "--api-key",
        help="Require 'Authorization: Bearer KEY' on every route but the chat page (also TFCLI_API_KEY).",
        envvar="TFCLI_API_KEY",
        show_default=False,
    ),
]

AllowedHosts = Annotated[
    Optional[str],
    typer.Option(
        "--allowed-hosts",
        help="Host names the server answers (the Host header; any port), comma-separated, or * for any "
        "[default: the loopback names for a loopback --host, any for 0.0.0.0 or ::, else the --host itself].",
        show_default=False,
    ),
]

ServedModelName = Annotated[
    Optional[list[str]],
    typer.Option(
        "--served-model-name",
        help="The model's name in the API (repeat it or separate names by commas; /v1/models lists them, the first names the "
        "model in responses) [default: the run's name]. A request may name the model anything: one model is served.",
        show_default=False,
    ),
]


def serve(
    run: DecoderRun,
    host: Annotated[str, typer.Option(help="The address to listen on (loopback by default: only this machine can connect).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port to listen on.")] = 8000,
    api_key: ApiKey = None,
    allowed_hosts: AllowedHosts = None,
    max_batch: Annotated[int, typer.Option(help="Completions decoded together, at most (rows of the KV cache).")] = 16,
    max_queue: Annotated[int, typer.Option(help="Requests waiting for room, at most; past it the server answers 503.")] = 64,
    served_model_name: ServedModelName = None,
    device: Device = "auto",
    threads: Threads = 0,
) -> None:
    """Serve a run: OpenAI's API (/v1/completions, /v1/chat/completions, /v1/models), a chat page at /,
    and the attention view of each exchange.

    Requests that arrive together are decoded together: finished completions leave the batch and waiting
    ones join it between steps. A prompt and its max_tokens must fit in the context (a 400 says so).
    Chat needs a run with a chat template (tfcli train finetune --task chat). A request naming another host
    (a web page that rebinds its DNS name to this machine) is refused: name the server's public names with
    --allowed-hosts when it sits behind one.

    \b
    Example: tfcli serve runs/quickstart/model --port 8000
    then:    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' -d '{"model": "model", "prompt": "Once upon a time", "max_tokens": 20}'
    """
    from tfcli.errors import TfcliError
    from tfcli.runtime import check_threads

    if not 0 < port < 65536:
        raise TfcliError(f"--port must be between 1 and 65535, not {port}")
    check_threads(threads)
    if api_key is not None and not api_key.strip():
        raise TfcliError("--api-key is empty", hint="pass a key, or leave the option out")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise TfcliError("tfcli serve needs FastAPI and uvicorn, which are not installed", hint="pip install 'tfcli[serve]'") from exc
    from tfcli.serve.admission import allowed_hosts as hosts_for
    from tfcli.serve.admission import is_loopback
    from tfcli.serve.server import bind, check_limits, load_served
    from tfcli.serve.server import serve as run_server

    check_limits(max_batch, max_queue)
    from tfcli.serve.app import model_names

    names = model_names(run, served_model_name or ())
    hosts = hosts_for(host, allowed_hosts)
    console = stderr_console()
    sock = bind(host, port)  # before loading: a bad --host or a port in use is told at once
    try:
        served = load_served(run, device=device, threads=threads, max_batch=max_batch, max_queue=max_queue, served_model_names=names)
    except BaseException:
        sock.close()
        raise
    if not is_loopback(host) and api_key is None:
        console.print(f"note: --host {host} lets other machines connect, and there is no --api-key", style="yellow", soft_wrap=True)

    def ready(url: str) -> None:
        chat = "chat template: yes" if served.template is not None else "no chat template (the chat route refuses; the page continues text)"
        console.print(f"serving {served.name} at {url}  (page {url}/, API {url}/v1; {chat}; Ctrl-C stops)", soft_wrap=True, highlight=False)

    run_server(served, sock, api_key=api_key, allowed_hosts=hosts, on_ready=ready)
