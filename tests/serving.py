"""What the serve tests share: a tiny chat run (a decoder fine-tuned on tests/test_chat.py's chats, so it has
a chat template and answers), and `tfcli serve`'s app started in a thread on a free loopback port."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.test_chat import finetune_args, write_chats


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
def running_server(run: Path, *, api_key: str | None = None, max_batch: int = 16, max_queue: int = 64):
    """`tfcli serve RUN` in this process: the app under uvicorn in a thread, until the block ends."""
    import uvicorn

    from tfcli.serve.app import create_app
    from tfcli.serve.server import load_served

    served = load_served(run, device="cpu", max_batch=max_batch, max_queue=max_queue)
    port = free_port()
    config = uvicorn.Config(create_app(served, api_key=api_key), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
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
        served.engine.stop()


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
