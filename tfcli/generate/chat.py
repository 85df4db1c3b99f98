"""`tfcli generate RUN --chat`: a conversation rendered with the run's chat template, answered turn by turn
over the interactive session's window (`conversation.py`), so the KV cache carries over between turns.

Before each reply the conversation must leave room for it: while the rendered prompt is longer than the
context less min(--max-new-tokens, a quarter of the context), its oldest exchanges are left out (a system
message stays), with a note (`fit_messages`, the rule `tfcli serve`'s chat page follows too). A reply ends
at the template's end-of-turn token or the end-of-text token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from tfcli.data.chat import without_oldest_exchange
from tfcli.errors import TfcliError
from tfcli.generate.conversation import Conversation
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Event, Notice
from tfcli.tokenizer.chat_template import ChatTemplate, Message
from tfcli.tokenizer.core import TOKENIZER_CONFIG_FILE


def run_template(run: Path, generator: Generator) -> ChatTemplate:
    """The chat template a run keeps in its tokenizer_config.json; an error when it has none."""
    path = Path(run) / TOKENIZER_CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    template = ChatTemplate.for_tokenizer(generator.tokenizer, config, str(run))
    if template is None:
        raise TfcliError(
            f"{run} has no chat template (chat_template in {TOKENIZER_CONFIG_FILE})",
            hint=f"fine-tune it for chat first: tfcli train finetune --init-from {run} --task chat --data CHATS.jsonl -o RUN",
        )
    return template


def reply_room(block: int, max_new_tokens: int) -> int:
    """The tokens a conversation's prompt may take before a reply: the context less min(the reply's limit, a
    quarter of the context).

    Example: block 96, max_new_tokens 10 -> 86; block 96, max_new_tokens 500 -> 72"""
    return block - min(max_new_tokens, block // 4)


def fit_messages(render: Callable[[list[Message]], list[int]], messages: Sequence[Message], room: int) -> tuple[list[int], list[Message], int]:
    """The context rule of a conversation about to be answered: while its prompt (`render`'s ids) is longer
    than `room`, its oldest exchange is left out, whole (a leading system message stays; the last exchange
    always stays, however long). Returns the prompt's ids, the messages kept and how many exchanges left.

    A conversation that fits is rendered once; one that does not, log2(its exchanges) times or so: the fewest
    exchanges to leave out are found by halving (a shorter conversation never renders to more tokens), so a
    request of a thousand messages costs about ten renders, not five hundred.

    Example: [user a, assistant a, user b], whose prompt is longer than `room` -> (ids of [user b], [user b], 1)"""
    shorter = [list(messages)]  # shorter[k]: the conversation less its k oldest exchanges
    while (next_shorter := without_oldest_exchange(shorter[-1])) is not None:
        shorter.append(next_shorter)
    rendered: dict[int, list[int]] = {}

    def fits(k: int) -> bool:
        if k not in rendered:
            rendered[k] = render(shorter[k])
        return len(rendered[k]) <= room

    low, high = 0, len(shorter) - 1  # the fewest to leave out lies in [low, high] (high: all but the last, fit or not)
    if fits(0):
        high = 0
    else:
        low = min(1, high)
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    fits(low)
    return rendered[low], shorter[low], low


class ChatSession:
    """A conversation of messages; each user message is answered by the model, and the answer joins it."""

    def __init__(self, generator: Generator, template: ChatTemplate, system: str | None = None) -> None:
        self.conversation = Conversation(generator)
        self.generator, self.template = generator, template
        generator.end_ids = generator.end_ids | template.end_of_turn_ids
        self.system = [Message("system", system)] if system else []
        template.check_content(self.system)
        self.messages: list[Message] = []

    def reset(self) -> None:
        self.messages = []
        self.conversation.reset()

    def abandon_reply(self) -> None:
        """An interrupted reply is not part of the conversation, nor the message it answered."""
        self.messages = self.messages[:-1]
        self.conversation.abandon_reply()

    def _context(self) -> tuple[list[int], int]:
        """The prompt's ids with room for the reply, and how many exchanges were left out to make it fit."""
        room = reply_room(self.generator.model.config.block_size, self.generator.settings.max_new_tokens)
        ids, self.messages, dropped = fit_messages(lambda messages: self.template.prompt_ids(self.system + messages), self.messages, room)
        return ids, dropped

    @torch.inference_mode()
    def reply(self, text: str) -> Iterator[Event]:
        """Add the user's message and yield the reply as it is made (Chunk events, then Finished)."""
        if not text.strip():
            raise TfcliError("the message is empty", hint="type some text; /reset forgets the conversation, /quit leaves")
        started = time.perf_counter()
        message = Message("user", text)
        self.template.check_content([message])
        self.messages.append(message)
        try:
            context, dropped = self._context()
        except TfcliError:
            self.messages.pop()
            raise
        if dropped:
            yield Notice(f"the conversation outgrew the context: its oldest {dropped} exchange{'s' if dropped > 1 else ''} left out", level="note")
        block = self.generator.model.config.block_size
        if len(context) > block - 1:
            yield Notice(f"the message makes a prompt of {len(context):,} tokens, more than the context ({block:,}); the model sees its last {block - 1:,}")
            context = context[-(block - 1) :]
        finished = yield from self.conversation.respond(context, text, started)
        self.messages.append(Message("assistant", finished.result.text))
        yield finished
