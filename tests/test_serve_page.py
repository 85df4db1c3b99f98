"""The chat page in a real browser (Chromium through Playwright): it sends a message, shows the reply as it
streams, keeps the conversation, and its link opens the exchange's attention view, which renders. The page
needs nothing from the network but the server."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.serving import make_chat_run, running_server

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing (apt-get install chromium)")
        pytest.skip("Chromium is not installed")
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
