"""A newcomer's edge cases in `tfcli serve` and `tfcli generate`: kept-alive connections answered without
Nagle's delay, a stream left mid-way, the API's limits met through the official `openai` client, an empty
prompt encoded as llama.cpp encodes it, and the command line's mistakes told in one line."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import sys
from pathlib import Path

import pytest

from tests.helpers import require
from tests.serving import make_chat_run, running_server, wait_until
from tfcli.tokenizer.chat_template import Message

openai = require("openai")
httpx = require("httpx")


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


# --- the connection -----------------------------------------------------------------------------------------


def test_the_servers_socket_gets_tcp_nodelay_on_every_connection_asyncio_accepts():
    """Without it a small answer on a kept-alive connection waited ~40 ms for the client's delayed ACK (Nagle):
    asyncio's loop, which uvicorn runs where uvloop is not installed, sets TCP_NODELAY only on a socket made with
    IPPROTO_TCP, and `bind` made its socket with protocol 0 (uvloop sets it on any TCP socket)."""
    from tfcli.serve.server import bind

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        accepted = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                accepted.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        sock = bind("127.0.0.1", 0)
        server = await loop.create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    loop = asyncio.SelectorEventLoop()  # asyncio's own, whatever loop policy is installed
    try:
        assert loop.run_until_complete(accepted_nodelay()) != 0
    finally:
        loop.close()


# --- the API's edge cases, through the official client ----------------------------------------------------


def test_a_chat_stream_of_three_completions_left_mid_way_frees_its_rows_and_the_next_requests_are_served(client, server):
    engine = server.served.engine
    messages = [{"role": "user", "content": "What about the dog?"}]
    stream = client.chat.completions.create(model="chat", messages=messages, max_tokens=60, n=3, stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    for _ in range(4):
        next(chunks)
    assert len(engine.rows) == 3
    stream.close()  # the client goes away mid-stream
    assert wait_until(lambda: not engine.rows and engine.queued == 0, 5), "every row left once the client went away"
    steps = engine.steps
    assert not wait_until(lambda: engine.steps > steps, 0.3), "no decoding for the client that left"
    for _ in range(2):
        reply = client.completions.create(model="chat", prompt="The fox", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 5
    assert not engine.rows


def test_a_waiting_client_that_leaves_gives_its_place_in_the_queue_back(chat_run):
    """One row, a queue of one: a request waits, its client leaves, and the next is queued, not refused as busy.
    The engine's steps wait on a gate meanwhile (a tiny model would finish the first request before the others come)."""
    import threading

    with running_server(chat_run, max_batch=1, max_queue=1) as running:
        engine = running.served.engine
        gate, step = threading.Event(), engine._step
        engine._step = lambda: (gate.wait(30), step())[1]
        long = {"model": "chat", "prompt": "The", "max_tokens": 30, "temperature": 0, "ignore_eos": True}
        try:
            with httpx.stream("POST", running.v1 + "/completions", json=long | {"stream": True}, timeout=30) as first:
                next(line for line in first.iter_lines() if line.startswith("data: "))
                body = json.dumps(long).encode()
                head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                with socket.create_connection(("127.0.0.1", int(running.url.rsplit(":", 1)[1]))) as leaving:
                    leaving.sendall(head.encode() + body)
                    assert wait_until(lambda: engine.queued == 1)
                assert wait_until(lambda: engine.queued == 0, 5), "the request whose client left is out of the queue"
                answers = []
                third = threading.Thread(target=lambda: answers.append(httpx.post(running.v1 + "/completions", json=long, timeout=30)))
                third.start()
                assert wait_until(lambda: engine.queued == 1 or answers), "the third request waits for the row"
                gate.set()
                third.join(timeout=30)
            assert answers[0].status_code == 200, answers[0].text
        finally:
            gate.set()


def _bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as raised:
        call()
    error = raised.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def test_max_tokens_past_the_context_is_openais_400(client, server):
    messages = [{"role": "user", "content": "What about the dog?"}]
    for call in (
        lambda: client.completions.create(model="chat", prompt="The fox", max_tokens=10_000),
        lambda: client.chat.completions.create(model="chat", messages=messages, max_tokens=10_000),
    ):
        error = _bad_request(call)
        assert error["code"] == "context_length_exceeded" and f"maximum context length is {server.served.block} tokens" in error["message"]


def test_n_completions_greedy_or_seeded(client):
    messages = [{"role": "user", "content": "What about the dog?"}]
    greedy = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, n=2, temperature=0)
    assert [c.index for c in greedy.choices] == [0, 1] and greedy.choices[0].message.content == greedy.choices[1].message.content
    sampled = client.completions.create(model="chat", prompt="The fox", max_tokens=6, n=3, seed=5, extra_body={"ignore_eos": True})
    again = client.completions.create(model="chat", prompt="The fox", max_tokens=6, n=3, seed=5, extra_body={"ignore_eos": True})
    assert [c.text for c in sampled.choices] == [c.text for c in again.choices] and sampled.usage.completion_tokens == 18
    assert len({c.text for c in sampled.choices}) > 1, "n samples are drawn apart"


def test_temperature_zero_is_greedy_whatever_the_seed(client):
    texts = {client.completions.create(model="chat", prompt="The fox", max_tokens=8, temperature=0, seed=seed).choices[0].text for seed in (1, 2, 3)}
    assert len(texts) == 1


def test_a_stop_string_spanning_tokens_is_cut_streamed_or_not(client, server):
    plain = {"model": "chat", "prompt": "The fox", "max_tokens": 20, "temperature": 0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    whole = client.completions.create(**plain).choices[0]
    pieces = [server.served.text([t]) for t in whole.model_extra["token_ids"]]
    assert "".join(pieces) == whole.text
    ends = [len("".join(pieces[: i + 1])) for i in range(len(pieces))]  # where each token's text ends

    def spanning(i: int) -> str:  # the last character of token i and the first of token i + 1
        return whole.text[ends[i] - 1 : ends[i] + 1]

    at = next(i for i in range(1, len(pieces) - 1) if pieces[i] and pieces[i + 1] and whole.text.index(spanning(i)) == ends[i] - 1)
    stop = spanning(at)
    cut = whole.text[: ends[at] - 1]
    stopped = client.completions.create(**plain, stop=[stop]).choices[0]
    assert stopped.text == cut and stopped.finish_reason == "stop"
    streamed = client.completions.create(**plain, stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut


def test_twenty_top_logprobs_are_given_and_more_is_a_400(client):
    messages = [{"role": "user", "content": "What about the dog?"}]
    reply = client.chat.completions.create(model="chat", messages=messages, max_tokens=2, logprobs=True, top_logprobs=20)
    assert all(len(entry.top_logprobs) == 20 for entry in reply.choices[0].logprobs.content)
    assert len(client.completions.create(model="chat", prompt="The fox", max_tokens=2, logprobs=20).choices[0].logprobs.top_logprobs[0]) == 20
    assert (
        _bad_request(lambda: client.chat.completions.create(model="chat", messages=messages, max_tokens=2, logprobs=True, top_logprobs=21))["param"]
        == "top_logprobs"
    )
    assert _bad_request(lambda: client.completions.create(model="chat", prompt="The fox", max_tokens=2, logprobs=21))["param"] == "logprobs"


def test_too_many_stop_strings_are_named_as_such(client):
    error = _bad_request(lambda: client.completions.create(model="chat", prompt="x", max_tokens=2, stop=["a", "b", "c", "d", "e"]))
    assert error["param"] == "stop" and error["message"] == "stop holds 5 strings; at most 4 are taken (OpenAI's limit)"
    error = _bad_request(lambda: client.completions.create(model="chat", prompt="x", max_tokens=2, extra_body={"stop": ["a", 5]}))
    assert error["param"] == "stop" and "stop[1] is a number (5), not a string" in error["message"]


def test_an_unknown_model_name_is_served_by_the_one_model_and_not_listed(client):
    assert client.completions.create(model="gpt-9", prompt="The fox", max_tokens=2).model == "chat"
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("gpt-9")
    assert raised.value.body["code"] == "model_not_found"


# --- an empty prompt, as llama.cpp encodes it ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bos_eos_run(tmp_path_factory, trained_tokenizer) -> Path:
    """A tiny Llama-shaped run whose tokenizer adds bos first and eos last (add_bos_token, add_eos_token)."""
    import shutil

    import torch

    from tests.test_gguf import _random_run
    from tfcli.model.config import ModelConfig
    from tfcli.tokenizer.core import TextTokenizer

    folder = tmp_path_factory.mktemp("bos-eos")
    shutil.copytree(trained_tokenizer, folder / "tok")
    config_path = folder / "tok" / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) | {"bos_token": "<|cls|>", "add_bos_token": True, "add_eos_token": True}
    config_path.write_text(json.dumps(config), encoding="utf-8")
    tokenizer = TextTokenizer.load(folder / "tok")
    assert tokenizer.adds_bos and tokenizer.adds_eos
    torch.manual_seed(0)
    shape = dict(positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False)
    return _random_run(
        folder / "run", ModelConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layers=1, n_heads=2, d_model=32, d_ff=64, **shape), tokenizer
    )


def test_an_empty_prompt_is_bos_eos_and_decodes_as_llama_cpp_decodes_it(cli, bos_eos_run, tmp_path):
    """llama.cpp's llama_tokenize(add_special) and llama-cpp-python's completions (0.3) read "" as [bos, eos] where
    the file adds both; tfcli generate and serve read it so, and decode the same tokens from it."""
    from tests.test_gguf import _llama, _llama_cpp, _llama_greedy, _suppressed
    from tfcli.gguf import export_gguf
    from tfcli.tokenizer.core import TextTokenizer

    llama_cpp = _llama_cpp()
    tokenizer = TextTokenizer.load(bos_eos_run)
    bos, eos = tokenizer.special_ids["bos"], tokenizer.special_ids["eos"]
    export_gguf(bos_eos_run, tmp_path / "model.gguf")
    llm = _llama(llama_cpp, tmp_path / "model.gguf")
    assert llm.tokenize(b"", add_bos=True, special=False) == [bos, eos] == tokenizer.prompt_ids([])
    assert llm.create_completion("", max_tokens=1, temperature=0)["usage"]["prompt_tokens"] == 2
    result = cli("generate", bos_eos_run, "--prompt", "", "--max-new-tokens", "8", "--ignore-eos", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    assert completion["prompt_tokens"] == 2
    assert completion["tokens"] == _llama_greedy(llm, [bos, eos], 8, _suppressed(tokenizer))
    with running_server(bos_eos_run) as running:
        body = {"model": "run", "prompt": "", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        answer = httpx.post(running.v1 + "/completions", json=body, timeout=30).json()
    assert answer["usage"]["prompt_tokens"] == 2 and answer["choices"][0]["token_ids"] == completion["tokens"]


def test_a_long_prompt_is_cropped_to_what_fits_beside_the_tokens_the_tokenizer_adds(cli, bos_eos_run):
    """The note said "keeping the last 64" where <s> and </s> took two of the 64 places."""
    result = cli("generate", bos_eos_run, "--prompt", "The fox ran. " * 30, "-n", "2", "--json")
    assert result.code == 0, result.stderr
    assert "more than the context (64) holds beside its beginning-of-text and end-of-text tokens; keeping the last 62" in result.stderr
    assert json.loads(result.stdout)["completions"][0]["prompt_tokens"] == 64


def test_an_empty_prompt_without_a_bos_token_is_a_clear_400(server):
    answer = httpx.post(server.v1 + "/completions", json={"model": "chat", "prompt": "", "max_tokens": 2}, timeout=30)
    assert answer.status_code == 400 and "no beginning-of-text token to start from" in answer.json()["error"]["message"]


# --- tfcli generate on the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "x", "--max-new-tokens", "0"], "it is how many tokens to write after the prompt"),
        (["-p", "x", "--max-new-tokens", "-3"], "--max-new-tokens must be between 1 and 1,000,000,000, not -3"),
        (["-p", "x", "--num-beams", "1000"], "--num-beams 1000 is more than the"),
        (["-p", "x", "--top-p", "0"], "--top-p must be in (0, 1], not 0.0"),
        (["-p", "x", "--temperature", "-1"], "--temperature must be between 0 and 100, not -1.0"),
    ],
)
def test_generate_mistakes_are_one_line_and_exit_2(cli, chat_run, args, message):
    result = cli("generate", chat_run, *args)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_beams_up_to_the_tokens_the_run_can_write_are_taken(cli, chat_run):
    from tfcli.generate.window import Vocabulary
    from tfcli.loader import load_run

    checkpoint = load_run(chat_run, "decode", "cpu", 0)
    vocab = Vocabulary.of(checkpoint.tokenizer, checkpoint.model.config.vocab_size)
    choosable = vocab.limit - len(vocab.suppressed)
    result = cli("generate", chat_run, "-p", "x", "--num-beams", str(choosable), "--num-samples", str(choosable), "-n", "1", "--json")
    assert result.code == 0, result.stderr
    assert len(json.loads(result.stdout)["completions"]) == choosable  # every beam its own token
    assert f"pass --num-beams {choosable} at most" in cli("generate", chat_run, "-p", "x", "--num-beams", str(choosable + 1)).stderr


def test_text_piped_without_an_option_says_how_to_read_it(cli, chat_run, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"The fox\n")))
    result = cli("generate", chat_run)
    assert result.code == 2 and "pass --prompt-file - (a prompt a line)" in result.stderr, result.stderr


def test_chat_without_a_template_is_one_line(cli, bos_eos_run):
    result = cli("generate", bos_eos_run, "--chat", "--prompt", "hi")
    assert result.code == 2 and "has no chat template" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


class _InterruptedStdin(io.TextIOWrapper):
    """A terminal where the user presses Ctrl-C at the prompt."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO())

    def isatty(self) -> bool:
        return True

    @property
    def buffer(self):
        class Interrupted:
            def readline(self, *args):
                raise KeyboardInterrupt

        return Interrupted()


def test_ctrl_c_at_the_chat_prompt_leaves_without_a_traceback(cli, chat_run, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _InterruptedStdin())
    result = cli("generate", chat_run, "--chat", "-n", "4")
    assert result.code == 130 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == "error: interrupted", "the message stands on a line of its own, not after the prompt"


def test_top_alternatives_leave_out_the_tokens_the_run_may_not_write():
    """More alternatives asked for than tokens a run may write (the rest at -inf): only the writable ones come back,
    as finite numbers (-inf is no JSON: the answer would have been a 500)."""
    import json
    import math

    import torch

    from tfcli.serve.engine import Engine, Sampling

    scores = torch.full((2, 30), float("-inf"))
    scores[:, :3] = torch.tensor([[2.0, 1.0, 0.5], [0.1, 0.2, 3.0]])
    chosen, logprobs, top = Engine._choose(Sampling(max_tokens=1, temperature=0.0, logprobs=20), scores, torch.Generator().manual_seed(0))
    assert chosen.tolist() == [0, 2] and all(math.isfinite(x) for x in logprobs)
    assert [sorted(t) for t in top] == [[0, 1, 2], [0, 1, 2]]
    json.dumps(top, allow_nan=False)


def test_a_completion_ended_by_its_end_token_lists_it_last_in_its_logprobs_streamed_or_not(client, server):
    """As vLLM lists it (lm-eval's local-completions takes the last entry for the generated token): the token that
    ended the completion, not in its text, with its log-probability; the chat API leaves it out, as OpenAI's does."""
    template = server.served.template
    prompt = template.render([Message("user", "What about the dog?")], add_generation_prompt=True)
    asked = {"model": "chat", "prompt": prompt, "max_tokens": 20, "temperature": 0, "logprobs": 1}
    whole = client.completions.create(**asked).choices[0]
    assert whole.finish_reason == "stop" and "<|im_end|>" not in whole.text
    assert whole.logprobs.tokens[-1] == "<|im_end|>" and whole.logprobs.token_logprobs[-1] < 0
    assert "".join(whole.logprobs.tokens[:-1]) == whole.text
    chunks = [c.choices[0] for c in client.completions.create(**asked, stream=True) if c.choices]
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == whole.logprobs.tokens
    reply = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "What about the dog?"}], max_tokens=20, logprobs=True)
    assert reply.choices[0].finish_reason == "stop" and all(entry.token != "<|im_end|>" for entry in reply.choices[0].logprobs.content)
