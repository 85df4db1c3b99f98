"""Schemathesis fires requests generated from the server's own OpenAPI schema (valid and invalid bodies, a
bounded number per route) at every route: no 5xx, each answered within its timeout, every error in OpenAI's
shape."""

from __future__ import annotations

import collections
import zlib

import pytest

from tests.serving import make_chat_run, running_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

EXAMPLES = 25  # per route (schemathesis adds its coverage cases: every method, boundary values)
SEEN: collections.Counter = collections.Counter()


@pytest.fixture(scope="module")
def served_schema(tmp_path_factory, trained_tokenizer):
    run = make_chat_run(tmp_path_factory, trained_tokenizer)
    with running_server(run, max_batch=8) as server:
        yield schemathesis.openapi.from_url(server.url + "/openapi.json")


api = schemathesis.pytest.from_fixture("served_schema")


def openai_error_shape(ctx, response, case) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"], body


@api.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_generated_requests_never_get_a_server_error(case):
    if (
        isinstance(case.body, dict) and "model" in case.body and zlib.crc32(repr(case.body).encode()) % 2
    ):  # half of them name the served model, to get past that check
        case.body["model"] = "chat"
    response = case.call(timeout=60)
    SEEN[(case.method, case.path, response.status_code)] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500], case.body)
    openai_error_shape(None, response, case)


def test_the_generated_requests_reached_the_model():
    """Runs after the generated requests (same file, in order): some got past every check and were decoded."""
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert SEEN[("POST", path, 200)] > 0, sorted(SEEN.items())
        assert SEEN[("POST", path, 400)] > 0
