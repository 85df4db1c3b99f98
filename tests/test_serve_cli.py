"""The commands: `tfcli serve` and `tfcli bench serve` check their options in one line before loading anything,
and `bench serve` measures a real server process end to end (a small round)."""

from __future__ import annotations

import json
import socket

import pytest

from tests.serving import make_chat_run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "RUN", "--port", "0"], "--port must be between 1 and 65535"),
        (["serve", "RUN", "--max-batch", "0"], "--max-batch must be between 1"),
        (["serve", "RUN", "--api-key", " "], "--api-key is empty"),
        (["serve", "RUN", "--threads", "100000"], "--threads must be between 0 (automatic) and this machine's"),
        (["serve", "RUN", "--host", "999.1.1.1"], "cannot listen on 999.1.1.1:8000: '999.1.1.1' is not an address"),
        (["serve", "RUN", "--host", "no-such-host.invalid"], "is not an address, or a name this machine resolves"),
        (["serve", "RUN", "--allowed-hosts", "models.example:8000"], "--allowed-hosts takes host names or addresses without a port"),
        (["bench", "serve", "RUN", "--clients", "1,x"], "--clients takes numbers"),
        (["bench", "serve", "RUN", "--clients", "0"], "--clients takes counts between 1 and 256"),
        (["bench", "serve", "NOWHERE"], "is not a run directory"),
        (["bench", "serve", "RUN", "--device", "tpu"], "unknown device 'tpu'"),
    ],
)
def test_bad_options_are_one_line_before_any_work(cli, tmp_path, args, message):
    (tmp_path / "config.json").write_text("{}")
    result = cli(*[str(tmp_path) if a == "RUN" else str(tmp_path / a) if a == "NOWHERE" else a for a in args])
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "serving" not in result.stderr + result.stdout


def test_serve_on_a_port_in_use_is_one_line_before_loading(cli, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # not a loadable run: the port is checked first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("serve", str(tmp_path), "--port", str(port))
    assert result.code == 2 and f"cannot listen on 127.0.0.1:{port}: the port is in use" in result.stderr and "--port" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "serving" not in result.stderr + result.stdout and "Traceback" not in result.stderr


@pytest.mark.slow
def test_bench_serve_measures_one_and_two_clients(cli, tmp_path_factory, trained_tokenizer):
    run = make_chat_run(tmp_path_factory, trained_tokenizer)
    result = cli("bench", "serve", run, "--clients", "1,2", "--requests", "2", "--max-tokens", "6", "--json")
    assert result.code == 0, result.stderr
    bench = json.loads(result.stdout)["bench"]
    one, two = bench["rounds"]
    assert (one["clients"], one["tokens"], two["clients"], two["tokens"]) == (1, 12, 2, 24)
    assert bench["device"] == "cpu" and one["speedup_over_one_client"] == 1.0 and two["tokens_per_second"] > 0 and two["server_cpu_seconds"] > 0
    assert two["busiest_batch"] >= 1 and 0 < two["ttft_ms"]["p50"] <= two["ttft_ms"]["p99"]
