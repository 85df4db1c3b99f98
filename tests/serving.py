"""What the serve tests share: a tiny chat run (a decoder fine-tuned on tests/test_chat.py's chats, so it has
a chat template and answers), and `tfcli serve`'s app started in a thread on a free loopback port."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from pathlib import Path

import pytest

from tests.test_chat import finetune_args, write_chats

_chat_runs: dict[Path, Path] = {}


def make_chat_run(tmp_path_factory, tokenizer_dir: Path, *, block_size: int = 96, steps: int = 30) -> Path:
    """A tiny decoder over the session's tokenizer, fine-tuned for chat for a few steps (once a session:
    every serve test file reads the same run)."""
    if tokenizer_dir in _chat_runs:
        return _chat_runs[tokenizer_dir]
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.cli.app import main
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    folder = tmp_path_factory.mktemp("serve")
    tokenizer = TextTokenizer.load(tokenizer_dir)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layers=1, n_heads=2, d_model=32, d_ff=64, tie_embeddings=False)
    parent = folder / "parent"
    save_checkpoint(parent, Transformer(config), tokenizer)
    chats = write_chats(folder / "chats.jsonl")
    run = folder / "chat"
    with pytest.raises(SystemExit) as stopped:
        main([str(a) for a in finetune_args(parent, chats, run, "--max-steps", str(steps), "--eval-every", str(steps), "--log-every", str(steps))])
    assert stopped.value.code in (0, None)
    _chat_runs[tokenizer_dir] = run
    return run


@dataclasses.dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    served: object  # tfcli.serve.app.Served
    server: object  # uvicorn.Server

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@contextlib.contextmanager
def running_server(
    run: Path,
    *,
    api_key: str | None = None,
    max_batch: int = 16,
    max_queue: int = 64,
    allowed_hosts: str | None = None,
    head_seconds: float | None = None,
    **load_options,
):
    """`tfcli serve RUN` in this process, as the command builds it (its socket, Host check, bounds), with
    uvicorn in a thread, until the block ends. `allowed_hosts` is --allowed-hosts' text (None: the default
    for 127.0.0.1); `head_seconds` shortens the time a request's head may take."""
    from tfcli.serve.admission import allowed_hosts as hosts_for
    from tfcli.serve.server import HEAD_SECONDS, bind, load_served, make_server

    served = load_served(run, device="cpu", max_batch=max_batch, max_queue=max_queue, **load_options)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    hosts = hosts_for("127.0.0.1", allowed_hosts)
    server = make_server(served, api_key=api_key, allowed_hosts=hosts, head_seconds=HEAD_SECONDS if head_seconds is None else head_seconds)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield Running(f"http://127.0.0.1:{port}", served, server)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        served.engine.stop()


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
