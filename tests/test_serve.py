"""`tfcli serve` through the official `openai` client: completions and chat, streaming and not, equal to
`tfcli generate`; seeded sampling; many clients at once (none lost or mixed, decoded together); a
cancelled stream leaves the batch; and every bad request answered with a clear 4xx in OpenAI's shape."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.serving import make_chat_run, running_server, wait_until

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

PROMPT = "The fox was happy, so it"


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, trained_tokenizer) -> Path:
    return make_chat_run(tmp_path_factory, trained_tokenizer)


@pytest.fixture(scope="module")
def server(chat_run):
    with running_server(chat_run) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


def generated(cli, *args) -> dict:
    result = cli("generate", *args, "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)["completions"][0]


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["chat"]
    assert client.models.retrieve("chat").id == "chat"
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 16


def test_greedy_completion_equals_generate_streamed_or_not(client, chat_run, cli):
    expected = generated(cli, chat_run, "--prompt", PROMPT, "-n", "20", "--ignore-eos")
    whole = client.completions.create(model="chat", prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = whole.choices[0]
    assert choice.text == expected["text"] and choice.model_extra["token_ids"] == expected["tokens"]
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 20
    scored = client.completions.create(model="chat", prompt=PROMPT, max_tokens=20, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    logprobs = scored.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 20 and "<|im_end|>" in logprobs.tokens  # special tokens named, as OpenAI does
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):  # greedy: each token is the likeliest
        assert len(top) == 2 and chosen == pytest.approx(max(top.values())) and chosen < 0
    chunks = list(client.completions.create(model="chat", prompt=PROMPT, max_tokens=20, temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected["text"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_equals_generate_chat_streamed_or_not(client, chat_run, cli):
    result = cli("generate", chat_run, "--chat", "--prompt", "What about the dog?", "-n", "10", "--no-stream")
    assert result.code == 0, result.stderr
    expected = result.stdout.rstrip("\n")
    messages = [{"role": "user", "content": "What about the dog?"}]
    reply = client.chat.completions.create(model="chat", messages=messages, max_tokens=10, temperature=0)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    assert expected.strip(), "the fine-tuned run answers something"
    streamed = client.chat.completions.create(model="chat", messages=messages, max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected


def test_a_seeded_sample_equals_generate_seed_whatever_else_is_decoding(client, chat_run, cli):
    expected = generated(cli, chat_run, "--prompt", PROMPT, "-n", "16", "--temperature", "0.9", "--top-p", "0.95", "--seed", "7", "--ignore-eos")
    ask = dict(model="chat", prompt=PROMPT, max_tokens=16, temperature=0.9, top_p=0.95, seed=7, extra_body={"ignore_eos": True, "return_token_ids": True})
    alone = client.completions.create(**ask).choices[0]
    assert alone.model_extra["token_ids"] == expected["tokens"] and alone.text == expected["text"]
    # the same request among others (unseeded, other prompts) draws from its own generator: the same tokens
    with ThreadPoolExecutor(6) as pool:
        others = [pool.submit(client.completions.create, model="chat", prompt=f"The dog {i}", max_tokens=24, temperature=1.0) for i in range(5)]
        again = pool.submit(client.completions.create, **ask)
        assert again.result().choices[0].model_extra["token_ids"] == expected["tokens"]
        assert all(o.result().choices[0].text is not None for o in others)


def test_sixteen_clients_at_once_each_get_their_own_text_decoded_together(client, server, chat_run):
    prompts = [f"{animal} {i}" for i, animal in enumerate(["The fox", "Tom had", "The dog", "Mia"] * 4)]
    alone = {
        p: client.completions.create(model="chat", prompt=p, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}).choices[0].text for p in prompts
    }
    steps_before = server.served.engine.steps
    barrier = threading.Barrier(16)

    def ask(prompt: str) -> tuple[str, str, str]:
        barrier.wait()
        reply = client.completions.create(model="chat", prompt=prompt, max_tokens=12, temperature=0, stream=True, extra_body={"ignore_eos": True})
        return prompt, "".join(c.choices[0].text for c in reply if c.choices), ""

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, prompts))
    assert len(results) == 16
    for prompt, text, _ in results:
        assert text == alone[prompt], prompt
    engine = server.served.engine
    assert engine.busiest > 1, "requests that arrive together are decoded together"
    assert engine.steps - steps_before < 16 * 11, "fewer steps than one request at a time"


def test_a_cancelled_stream_frees_its_row(server, chat_run):
    engine = server.served.engine
    body = {"model": "chat", "prompt": "Once", "max_tokens": 80, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert len(engine.rows) == 1
    assert wait_until(lambda: not engine.rows, 5), "the row left once the client went away"


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def post(server, path: str, **kwargs):
    return httpx.post(server.v1 + path, timeout=30, **kwargs)


def test_bad_requests_get_a_clear_4xx_in_openais_shape(server):
    ok = {"model": "chat", "prompt": "The fox", "max_tokens": 4}
    assert (
        "not valid JSON"
        in error_of(post(server, "/completions", content=b'{"model": "chat", "prompt": ', headers={"content-type": "application/json"}), 400)["message"]
    )
    invalid_utf8 = b'{"model": "chat", "prompt": "\xff\xfe fox"}'
    error_of(post(server, "/completions", content=invalid_utf8, headers={"content-type": "application/json"}), 400)
    assert error_of(post(server, "/completions", json=ok | {"promt": "x"}), 400)["param"] == "promt"
    assert error_of(post(server, "/completions", json=ok | {"n": 1000}), 400)["param"] == "n"
    assert error_of(post(server, "/completions", json=ok | {"n": 17}), 400)["param"] == "n"  # more than --max-batch at once
    assert "maximum context length" in error_of(post(server, "/completions", json=ok | {"prompt": "fox " * 200}), 400)["message"]
    assert error_of(post(server, "/completions", json=ok | {"max_tokens": 500}), 400)["code"] == "context_length_exceeded"
    assert error_of(post(server, "/completions", json=ok | {"prompt": [5, 99999]}), 400)["param"] == "prompt"
    assert (
        "surrogate"
        in error_of(post(server, "/completions", content=b'{"model": "chat", "prompt": "\\ud800"}', headers={"content-type": "application/json"}), 400)[
            "message"
        ]
    )
    assert error_of(post(server, "/completions", json=ok | {"temperature": -1}), 400)["param"] == "temperature"
    assert post(server, "/completions", json=ok | {"model": "gpt-4"}).json()["model"] == "chat"  # one model is served: any name is taken
    assert error_of(httpx.get(server.v1 + "/models/gpt-4"), 404)["code"] == "model_not_found"  # but only its own names are listed
    assert error_of(post(server, "/completions", json=ok | {"prompt": ""}), 400)["param"] == "prompt"
    assert error_of(post(server, "/completions", json=[1, 2]), 400)
    assert error_of(post(server, "/completions", content=b"", headers={"content-type": "application/json"}), 400)
    big = b'{"model": "chat", "prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    assert error_of(post(server, "/completions", content=big, headers={"content-type": "application/json"}), 413)["code"] == "request_too_large"
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi <|im_end|> there"}]}
    assert "special token" in error_of(post(server, "/chat/completions", json=chat), 400)["message"]
    assert error_of(post(server, "/chat/completions", json={"model": "chat", "messages": []}), 400)["param"] == "messages"
    assert error_of(post(server, "/chat/completions", json={"model": "chat", "messages": [{"role": "robot", "content": "x"}]}), 400)
    error_of(httpx.get(server.url + "/v1/nothing"), 404)
    error_of(httpx.get(server.v1 + "/completions"), 405)
    error_of(httpx.get(server.url + "/attention/cmpl-unknown"), 404)


def test_a_body_not_sent_as_json_says_to_send_it_so(server):
    """`curl -d '{...}'` without -H sends a form's Content-Type: FastAPI leaves the body unparsed, and pydantic
    answered "Input should be a valid dictionary or object to extract fields from" about a body that is one."""
    body = json.dumps({"model": "chat", "prompt": "The fox", "max_tokens": 2})
    form = error_of(post(server, "/completions", content=body, headers={"content-type": "application/x-www-form-urlencoded"}), 415)
    assert form["message"].startswith("the body is sent as 'application/x-www-form-urlencoded'") and "'Content-Type: application/json'" in form["message"]
    assert "sent without a Content-Type" in error_of(post(server, "/chat/completions", content=body), 415)["message"]
    assert "the body must be a JSON object" in error_of(post(server, "/completions", json=[1, 2]), 400)["message"]
    assert post(server, "/completions", content=body, headers={"content-type": "application/json; charset=utf-8"}).status_code == 200


def test_a_run_without_a_chat_template_refuses_chat_clearly(tmp_path, trained_tokenizer):
    import torch

    from tfcli.checkpoint import save_checkpoint
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(trained_tokenizer)
    torch.manual_seed(0)
    save_checkpoint(
        tmp_path / "plain", Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layers=1, n_heads=2, d_model=32, d_ff=64)), tokenizer
    )
    with running_server(tmp_path / "plain", api_key="sesame", max_batch=1, max_queue=1) as running:
        chat = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}
        key = {"Authorization": "Bearer sesame"}
        assert error_of(httpx.post(running.v1 + "/chat/completions", json=chat), 401)["code"] == "invalid_api_key"
        assert error_of(httpx.get(running.v1 + "/models", headers={"Authorization": "Bearer wrong"}), 401)
        assert httpx.get(running.url + "/").status_code == 200  # the page asks for the key itself
        assert error_of(httpx.post(running.v1 + "/chat/completions", json=chat, headers=key), 400)["code"] == "no_chat_template"
        # one row, one waiting request: a third is told the server is busy (503). The engine's steps wait on a
        # gate meanwhile (a tiny model would finish the first request before the others arrive).
        long = {"model": "plain", "prompt": "The", "max_tokens": 30, "temperature": 0, "stream": True, "ignore_eos": True}
        engine = running.served.engine
        gate, step = threading.Event(), engine._step
        engine._step = lambda: (gate.wait(30), step())[1]
        with httpx.stream("POST", running.v1 + "/completions", json=long, headers=key, timeout=30) as first:
            next(line for line in first.iter_lines() if line.startswith("data: "))
            waiting = threading.Thread(
                target=httpx.post, args=(running.v1 + "/completions",), kwargs={"json": long | {"stream": False}, "headers": key, "timeout": 30}
            )
            waiting.start()
            assert wait_until(lambda: engine.queued == 1)
            busy = httpx.post(running.v1 + "/completions", json=long | {"stream": False}, headers=key)
            assert error_of(busy, 503)["code"] == "server_busy" and busy.headers["retry-after"] == "1"
            gate.set()
        waiting.join(timeout=30)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, shards) -> Path:
    from tests.test_serve_page import make_plain_run

    return make_plain_run(tmp_path_factory, shards)


def test_the_pages_route_keeps_answering_a_run_without_a_chat_template_past_its_context(plain_run, cli, monkeypatch):
    import io
    import sys

    from tests.test_serve_page import LINES
    from tfcli.generate.chat import reply_room
    from tfcli.generate.conversation import transcript_ids
    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(plain_run)

    def text_ids(messages: list[dict]) -> list[int]:
        return transcript_ids(tokenizer, [m["content"] for m in messages])

    room = reply_room(32, 8)
    replies, left_out = [], 0
    with running_server(plain_run) as running:
        conversation: list[dict] = []
        for line in LINES:  # far more than 32 tokens hold
            messages = [*conversation, {"role": "user", "content": line}]
            ask = {"model": "plain", "messages": messages, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
            response = httpx.post(running.url + "/chat", json=ask, timeout=30)
            assert response.status_code == 200, response.text
            dropped = int(response.headers["x-dropped-exchanges"])
            kept = messages[2 * dropped :]
            choice = response.json()["choices"][0]
            # the text so far (each message a line), less the fewest oldest exchanges that leave the reply its room
            assert choice["prompt_token_ids"] == text_ids(kept) and len(text_ids(kept)) <= room
            assert not dropped or len(text_ids(messages[2 * dropped - 2 :])) > room
            reply = choice["message"]["content"]
            assert reply.strip() and "\n" not in reply, reply  # a line answers a line
            replies.append(reply)
            conversation, left_out = [*kept, {"role": "assistant", "content": reply}], left_out + dropped
        assert left_out >= len(LINES) // 2
        # API clients keep OpenAI's answers: a prompt past the context is a 400, and chat needs a template
        whole = "".join(m["content"] + "\n" for m in messages)
        too_long = post(running, "/completions", json={"model": "plain", "prompt": whole * 2, "max_tokens": 8})
        assert error_of(too_long, 400)["code"] == "context_length_exceeded"
        assert error_of(post(running, "/chat/completions", json={"model": "plain", "messages": messages}), 400)["code"] == "no_chat_template"
    # the first reply is `tfcli generate --interactive`'s for the same line, greedy by default
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((LINES[0] + "\n").encode())))
    result = cli("generate", plain_run, "--interactive", "-n", "8")
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines() == [replies[0]]


def test_the_pages_route_answers_a_chat_run_as_generate_chat_does_and_drops_the_same_exchanges(server, chat_run, cli, monkeypatch):
    import io
    import re
    import sys

    lines = [f"What about the {animal}?" for animal in ("fox", "dog", "cat", "fox", "dog", "cat")]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(line + "\n" for line in lines).encode())))
    result = cli("generate", chat_run, "--chat", "-n", "6")
    assert result.code == 0, result.stderr
    expected = result.stdout.splitlines()
    left_out_by_generate = sum(int(n) for n in re.findall(r"its oldest (\d+) exchange", result.stderr))
    conversation: list[dict] = []
    replies, left_out = [], 0
    for line in lines:
        messages = [*conversation, {"role": "user", "content": line}]
        response = httpx.post(server.url + "/chat", json={"model": "chat", "messages": messages, "max_tokens": 6, "temperature": 0}, timeout=30)
        assert response.status_code == 200, response.text
        dropped = int(response.headers["x-dropped-exchanges"])
        replies.append(response.json()["choices"][0]["message"]["content"])
        conversation, left_out = [*messages[2 * dropped :], {"role": "assistant", "content": replies[-1]}], left_out + dropped
    assert replies == expected and left_out == left_out_by_generate > 0
    # the API answers the whole conversation as OpenAI does: it does not fit, and says so
    whole = [*[{"role": r, "content": c} for q, a in zip(lines, replies) for r, c in (("user", q), ("assistant", a))], {"role": "user", "content": "And?"}]
    error = error_of(post(server, "/chat/completions", json={"model": "chat", "messages": whole, "max_tokens": 6}), 400)
    assert error["code"] == "context_length_exceeded"
