"""What a request may cost `tfcli serve` is bounded before any work (issue 43): the rows (prompts x n) against
--max-batch whatever max_tokens is, echo's log-probabilities (prompt tokens x n x (1 + logprobs)) against
a limit, echo's scoring and its response built off the event loop; a non-streaming client that leaves
frees its rows at the next step; any model name is taken while one model is served, and
--served-model-name names it; and JSON's true is not a number."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from tests.serving import make_chat_run, running_server, wait_until

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

MAX_BATCH = 4


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, trained_tokenizer) -> Path:
    return make_chat_run(tmp_path_factory, trained_tokenizer)


@pytest.fixture(scope="module")
def server(chat_run):
    with running_server(chat_run, max_batch=MAX_BATCH) as running:
        yield running


def post(server, body: dict):
    return httpx.post(server.v1 + "/completions", json=body, timeout=60)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


# -- item 3: a small request cannot hold gigabytes ---------------------------------------------------------


def test_the_audits_echo_request_is_refused_before_any_work(server):
    """The audit's request, scaled: many prompts x n with echo and logprobs and max_tokens 0 skipped the
    prompts x n <= --max-batch check (128 x 128 held 3 GB and ended in a 500)."""
    engine = server.served.engine
    scored = []
    run_task = engine._run_task
    engine._run_task = lambda ticket: (scored.append(ticket), run_task(ticket))[1]
    try:
        prompts = [f"The fox {i} was happy, so it ran to the park" for i in range(MAX_BATCH)]
        audit = {"model": "chat", "prompt": prompts, "n": MAX_BATCH, "max_tokens": 0, "echo": True, "logprobs": 20}
        error = error_of(post(server, audit), 400)
        assert error["param"] == "n" and f"at most {MAX_BATCH}" in error["message"], error
        for max_tokens in (1, 0):  # refused the same whatever max_tokens says
            assert error_of(post(server, audit | {"max_tokens": max_tokens, "n": 2}), 400)["param"] == "n"
        assert not scored, "refused before the prompts were scored"
        fits = post(server, audit | {"prompt": prompts[:2], "n": 2})
        assert fits.status_code == 200 and len(scored) == 1, fits.text[:300]
    finally:
        engine._run_task = run_task
    choices = fits.json()["choices"]
    assert len(choices) == 4 and all(c["logprobs"]["top_logprobs"][1] and c["text"].startswith("The fox") for c in choices)


def test_echo_log_probabilities_past_the_limit_are_a_clear_400(server, monkeypatch):
    from tfcli.serve import app

    prompt = list(range(5, 25))  # 20 ids: 20 x (1 + 4) = 100 entries with logprobs 4
    ask = {"model": "chat", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 4}
    monkeypatch.setattr(app, "MAX_ECHO_LOGPROBS", 99)
    error = error_of(post(server, ask), 400)
    assert error["param"] == "logprobs" and error["code"] == "echo_too_large", error
    assert "100" in error["message"] and "99" in error["message"]  # what it asks for, the limit
    assert post(server, ask | {"logprobs": 1}).status_code == 200  # 20 x 2 = 40
    assert error_of(post(server, ask | {"logprobs": 1, "n": 3}), 400)["param"] == "logprobs"  # each completion echoes them: 3 x 40
    monkeypatch.setattr(app, "MAX_ECHO_LOGPROBS", 100)
    answer = post(server, ask)
    assert answer.status_code == 200 and len(answer.json()["choices"][0]["logprobs"]["tokens"]) == 20


def test_echo_logprobs_are_built_off_the_event_loop(server, monkeypatch):
    """The scoring runs in the engine's thread and the echoed tokens' texts and log-probabilities are built
    in a worker thread: the event loop only sends them (the audit's request blocked it for 220 s)."""
    served = server.served
    on_loop: list[bool] = []
    token_text, text = served.token_text, served.text

    def running_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    monkeypatch.setattr(served, "token_text", lambda token: (on_loop.append(running_loop()), token_text(token))[1])
    monkeypatch.setattr(served, "text", lambda ids: (on_loop.append(running_loop()), text(ids))[1])
    ask = {"model": "chat", "prompt": ["The fox was happy", "Tom had a red ball"], "n": 2, "max_tokens": 0, "echo": True, "logprobs": 3}
    whole = post(server, ask)
    assert whole.status_code == 200 and len(whole.json()["choices"]) == 4
    events = [line for line in httpx.post(server.v1 + "/completions", json=ask | {"stream": True}, timeout=60).text.splitlines() if line.startswith("data: {")]
    assert len(json.loads(events[0][6:])["choices"]) == 4 and json.loads(events[0][6:])["choices"][0]["logprobs"]["top_logprobs"][1]
    assert on_loop and not any(on_loop), f"{sum(on_loop)} of {len(on_loop)} token texts were made on the event loop"


# -- item 4: a non-streaming client that leaves frees its rows ----------------------------------------------


def test_a_non_streaming_client_that_leaves_frees_its_rows_within_a_step(server):
    engine = server.served.engine
    step = engine._step
    engine._step = lambda: (time.sleep(0.05), step())[1]  # 80 steps: 4 s of decoding left when the client goes
    try:
        body = json.dumps({"model": "chat", "prompt": "Once", "n": 2, "max_tokens": 80, "temperature": 0, "ignore_eos": True}).encode()
        port = int(server.url.rsplit(":", 1)[1])
        head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(head.encode() + body)
            assert wait_until(lambda: len(engine.rows) == 2, 10), "the request is decoding"
            started = engine.steps
            assert wait_until(lambda: engine.steps >= started + 3, 10)
        gone = time.monotonic()  # the client closed its connection without reading an answer
        assert wait_until(lambda: not engine.rows, 1.0), f"the rows still decode {time.monotonic() - gone:.1f} s after the client left"
        assert engine.steps - started < 40, "its rows left long before their 80 tokens"
    finally:
        engine._step = step
    assert post(server, {"model": "chat", "prompt": "The fox", "max_tokens": 2}).status_code == 200  # the server goes on


# -- item 6: the model's names -------------------------------------------------------------------------------


def test_any_model_name_is_taken_while_one_model_is_served(server):
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["chat"]
    for name in ("model", "gpt-4", "chat"):  # the README's model="model" on any folder, a name from elsewhere
        reply = client.completions.create(model=name, prompt="The fox", max_tokens=2, temperature=0)
        assert reply.model == "chat" and reply.choices[0].finish_reason
    assert error_of(httpx.get(server.v1 + "/models/gpt-4"), 404)["code"] == "model_not_found"


def test_a_run_served_from_best_is_named_after_its_run_and_served_model_name_renames_it(chat_run, tmp_path):
    import shutil

    from tfcli.errors import TfcliError
    from tfcli.serve.server import load_served

    best = shutil.copytree(chat_run, tmp_path / "story" / "best")
    kept = shutil.copytree(chat_run, tmp_path / "story" / "checkpoints" / "step-0000030")
    for run in (best, kept):
        with running_server(run, max_batch=1) as running:
            assert [m["id"] for m in httpx.get(running.v1 + "/models").json()["data"]] == ["story"]
            assert httpx.get(running.v1 + "/models/story").json()["id"] == "story"
    with running_server(best, max_batch=1, served_model_names=["tiny-chat", "gpt-3.5-turbo,tiny-chat"]) as running:
        assert [m["id"] for m in httpx.get(running.v1 + "/models").json()["data"]] == ["tiny-chat", "gpt-3.5-turbo"]
        assert httpx.get(running.v1 + "/models/gpt-3.5-turbo").json()["id"] == "gpt-3.5-turbo"
        answer = httpx.post(running.v1 + "/completions", json={"model": "gpt-3.5-turbo", "prompt": "The", "max_tokens": 1}, timeout=60).json()
        assert answer["model"] == "tiny-chat"
    for names in (["tiny", " "], ["x" * 300], ["a,,b"]):
        with pytest.raises(TfcliError, match="--served-model-name"):
            load_served(best, device="cpu", served_model_names=names)


def test_served_model_name_from_the_command_line(cli, tmp_path):
    result = cli("serve", str(tmp_path), "--served-model-name", "")
    assert result.code == 2 and "--served-model-name" in result.stderr and "Traceback" not in result.stderr


# -- JSON's true is not a number ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("completions", "max_tokens", True),
        ("completions", "n", True),
        ("completions", "logprobs", True),
        ("completions", "seed", False),
        ("completions", "temperature", True),
        ("completions", "top_p", True),
        ("completions", "prompt", [True, 5]),
        ("completions", "best_of", True),
        ("chat/completions", "max_tokens", True),
        ("chat/completions", "max_completion_tokens", True),
        ("chat/completions", "top_logprobs", True),
        ("chat/completions", "n", True),
    ],
)
def test_true_is_not_a_number(server, route, field, value):
    body = {"model": "chat", "prompt": "The fox"} if route == "completions" else {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    error = error_of(httpx.post(f"{server.v1}/{route}", json=body | {field: value}, timeout=60), 400)
    assert error["param"] == field and error["type"] == "invalid_request_error", error
