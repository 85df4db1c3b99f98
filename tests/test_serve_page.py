"""The chat page in a real browser (Chromium through Playwright): it sends a message, shows the reply as it
streams, keeps the conversation, and its link opens the exchange's attention view, which renders; on a run
without a chat template it keeps answering past the context, greedily unless told otherwise. The page needs
nothing from the network but the server."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import missing_tool
from tests.serving import make_chat_run, running_server

CHROMIUM = "/usr/bin/chromium"
TINY_MODEL = ["--set", "d_model=32", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "eval_batches=1"]
LINES = ["Once upon a time", "The fox was happy", "Tom had three apples", "The dog did not like the rain", "The fox", "Mia", "The cat", "Once upon a time"]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing (apt-get install chromium)")
        missing_tool("Chromium is not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"), args=ARGS)
        yield browser
        browser.close()


def test_the_page_streams_a_reply_and_links_its_attention_view(browser, tmp_path_factory, trained_tokenizer):
    run = make_chat_run(tmp_path_factory, trained_tokenizer)
    with running_server(run) as server:
        context = browser.new_context()
        outside: list[str] = []
        context.route(
            "**/*", lambda route: (outside.append(route.request.url), route.abort()) if not route.request.url.startswith(server.url) else route.continue_()
        )
        engine = server.served.engine  # each step waits a little, so that every chunk reaches the page on its own
        step = engine._step
        engine._step = lambda: (time.sleep(0.05), step())[1]
        page = context.new_page()
        page.goto(server.url + "/")
        assert page.title() == "tfcli serve: chat"
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "8")
        # the reply is shown as its chunks arrive: the page's text grows while the stream is open
        page.evaluate(
            """() => { window.lengths = []; new MutationObserver(() => {
                 const reply = document.querySelector('.assistant'); if (reply) window.lengths.push(reply.firstChild.data.length); })
               .observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true}); }"""
        )
        page.fill("#message", "What about the dog?")
        page.click("#send")
        link = page.wait_for_selector(".assistant .attention-link", timeout=30_000)
        reply = page.locator(".assistant").first.evaluate("node => node.firstChild.data")
        assert reply.strip(), "a reply was shown"
        lengths = page.evaluate("window.lengths")
        assert len(set(lengths)) > 2 and max(lengths) == len(reply), lengths
        assert page.locator(".user").first.text_content() == "What about the dog?"
        # a second message: the page sends the whole conversation (kept in the page), and gets a second reply
        page.fill("#message", "And the fox?")
        page.click("#send")
        page.wait_for_function("document.querySelectorAll('.assistant .attention-link').length === 2", timeout=30_000)
        assert page.locator(".user").count() == 2
        with context.expect_page() as opened:
            link.click()
        view = opened.value
        view.wait_for_load_state()
        assert view.title().startswith("attention of chat")
        view.wait_for_function("document.querySelectorAll('canvas').length > 0 || document.querySelectorAll('svg').length > 0", timeout=30_000)
        assert "What about the dog?" in view.content() or "dog" in view.inner_text("body")
        assert not outside, f"the page asked the network for {outside}"
        context.close()


def make_plain_run(tmp_path_factory, shards: Path) -> Path:
    """A tiny decoder pretrained for a few seconds on the tiny text, with no chat template and a context of 32
    tokens: the page continues its text, and a conversation outgrows the context within two messages."""
    from tfcli.cli.app import main

    run = tmp_path_factory.mktemp("plain") / "plain"
    args = ["train", "pretrain", "--data", shards, "-o", run, "--block-size", "32", "--batch-size", "8", "--device", "cpu", "--max-steps", "150"]
    with pytest.raises(SystemExit) as stopped:
        main([str(a) for a in [*args, "--lr", "1e-2", *TINY_MODEL]])
    assert stopped.value.code in (0, None)
    return run


def test_the_page_keeps_answering_a_run_without_a_chat_template_past_its_context_greedily(browser, tmp_path_factory, shards):
    run = make_plain_run(tmp_path_factory, shards)
    with running_server(run) as server:
        assert server.served.template is None and server.served.block == 32
        context = browser.new_context()
        page = context.new_page()
        sent: list[dict] = []
        page.on("request", lambda request: sent.append(json.loads(request.post_data)) if request.method == "POST" else None)
        page.goto(server.url + "/")
        for count, line in enumerate(LINES, start=1):  # far more than 32 tokens hold
            page.fill("#message", line)
            page.click("#send")
            page.wait_for_function(
                f"document.querySelectorAll('.assistant .attention-link').length === {count} || document.querySelector('.error') !== null", timeout=30_000
            )
            assert not page.locator(".error").count(), f"message {count}: {page.locator('.error').first.text_content()}"
        replies = page.locator(".assistant").evaluate_all("nodes => nodes.map(node => node.firstChild.data)")
        assert len(replies) == len(LINES) and all(reply.strip() for reply in replies), replies
        assert any("its oldest exchange" in note for note in page.locator(".note").all_text_contents())
        # the page decodes as `tfcli generate` does by default: greedily (temperature 0), unless its field says otherwise
        assert len(sent) == len(LINES) and all(body["temperature"] == 0 for body in sent), sent
        assert len(sent[-1]["messages"]) < 2 * len(LINES) - 1, "the page keeps only the exchanges the server kept"
        context.close()
