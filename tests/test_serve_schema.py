"""Schemathesis fires requests generated from the server's own OpenAPI schema (valid and invalid bodies, a
bounded number per route) at every route: no 5xx, each answered within its timeout, every error in OpenAI's
shape."""

from __future__ import annotations

import collections
import zlib

import pytest

from tests.serving import make_chat_run, running_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

EXAMPLES = 25  # per route and generation mode, beside schemathesis's coverage cases (every method, boundary values)


@pytest.fixture(scope="module")
def served_schema(tmp_path_factory, trained_tokenizer):
    run = make_chat_run(tmp_path_factory, trained_tokenizer)
    with running_server(run, max_batch=8) as server:
        yield schemathesis.openapi.from_url(server.url + "/openapi.json")


def openai_error_shape(response) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"], body


def test_generated_requests_never_get_a_server_error(served_schema):
    """Through schemathesis's public API (its coverage cases, then valid and invalid bodies drawn by
    hypothesis), not its pytest plugin, whose lazy schemas reach into pytest's private node fields."""
    seen: collections.Counter = collections.Counter()

    def check(case) -> None:
        if isinstance(case.body, dict) and "model" in case.body and zlib.crc32(repr(case.body).encode()) % 2:
            case.body["model"] = "chat"  # half of them name the served model, to get past that check
        response = case.call(timeout=60)
        seen[(case.method, case.path, response.status_code)] += 1
        assert response.status_code < 500, (response.status_code, response.text[:500], case.method, case.path, case.body)
        openai_error_shape(response)

    operations = [result.ok() for result in served_schema.get_all_operations()]
    assert {(operation.method.upper(), operation.path) for operation in operations} >= {("POST", "/v1/completions"), ("POST", "/v1/chat/completions")}
    for operation in operations:
        coverage = served_schema.config.generation_for(operation=operation, phase="coverage")
        for case in served_schema.iter_coverage_cases(operation, generation_modes=list(GenerationMode), generation_config=coverage):
            check(case)
        # a body can be made invalid; a route that takes none, or only a free string in its path, cannot
        for mode in GenerationMode if len(operation.body) else [GenerationMode.POSITIVE]:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
            def fuzz(case) -> None:
                check(case)

            fuzz()
    for path in ("/v1/completions", "/v1/chat/completions"):  # some got past every check and were decoded
        assert seen[("POST", path, 200)] > 0, sorted(seen.items())
        assert seen[("POST", path, 400)] > 0
    assert any(method != "POST" and path == "/v1/completions" for method, path, _ in seen)  # the coverage cases' other methods
