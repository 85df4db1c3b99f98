"""Text out of every tokenizer layout through the library's own decoder: streamed pieces after a prompt join
to decode(prompt + new) less decode(prompt), as `tokenizers` (and transformers) decode the ids, for real text
and for random ids; a character split across tokens never shows as U+FFFD; the work per token stays bounded."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.layouts import HUB_LAYOUTS, TFCLI_LAYOUTS, build_layout
from tfcli.generate.stream import CompletionText
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.detokenize import WINDOW_TOKENS, IncrementalDecoder, decode_completion, decode_pieces, text_byte_lengths
from tfcli.tokenizer.show import token_label, token_text, views_of_ids

LAYOUTS = HUB_LAYOUTS + TFCLI_LAYOUTS
REAL_TEXTS = [
    "Once upon a time, there was a little girl named Lily.\nShe loved to play outside.",
    'They went to the beach. They saw a big box 🦊🎉 and said: "Let\'s open it!"',
    "The café was naïve; the résumé said déjà vu. Ωμέγα, straße.",
    "東京へ行きました。你好，世界！ 한국어 텍스트",
    "Lines\n\n\tindented\n    four spaces   then   gaps  \n\nend\n",
    "  leading spaces, trailing ones   ",
]


def _transformers():
    """transformers, the outside client these texts are checked against: a skip without it, a failure in CI."""
    if os.environ.get("CI"):
        import transformers

        return transformers
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, TextTokenizer]:
    folder = tmp_path_factory.mktemp("layouts")
    return {layout: TextTokenizer.load(build_layout(layout, folder / layout)) for layout in LAYOUTS}


def reference(tokenizer: TextTokenizer, context: list[int], ids: list[int]) -> str:
    """The completion's text by definition: one decode of everything, less the context's decode off the front."""
    full = tokenizer.hf.decode(context + ids, skip_special_tokens=True)
    return full[len(tokenizer.hf.decode(context, skip_special_tokens=True)) :]


def streamed(tokenizer: TextTokenizer, context: list[int], ids: list[int]) -> list[str]:
    text = CompletionText(tokenizer, context)
    chunks = [text.add(i) for i in ids] + [text.finish()]
    assert "".join(chunks) == text.text == "".join(text.pieces)
    return chunks


def transformers_tokenizer(tokenizer: TextTokenizer):
    transformers = _transformers()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.hf.__class__.from_str(tokenizer.hf.to_str()))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_real_text_streams_as_the_decoder_writes_it(layouts, layout):
    tokenizer = layouts[layout]
    prompt_starts = [[]] + ([[tokenizer.special_ids["bos"]]] if tokenizer.adds_bos else [])
    for text in REAL_TEXTS:
        ids = tokenizer.encode(text)
        for start in prompt_starts:
            for cut in sorted({0, 1, len(ids) // 3, len(ids) // 2, len(ids) - 1}):
                context, new = start + ids[:cut], ids[cut:]
                chunks = streamed(tokenizer, context, new)
                expected = reference(tokenizer, context, new)
                assert "".join(chunks) == expected == decode_completion(tokenizer, context, new)
                prompt = tokenizer.hf.decode(context, skip_special_tokens=True)
                if not prompt.endswith("\ufffd"):  # a prompt cut between tokens, not inside a character
                    # the prompt's text and the completion's read as one text: no space eaten at the seam
                    assert prompt + expected == tokenizer.hf.decode(start + ids, skip_special_tokens=True)
                    assert not any("\ufffd" in c for c in chunks), chunks  # a split character shows once, whole


@pytest.mark.parametrize("layout", LAYOUTS)
def test_random_ids_stream_as_the_decoder_writes_them(layouts, layout):
    tokenizer = layouts[layout]
    rng = random.Random(layout)
    for _ in range(150):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 45))]
        cut = rng.randrange(len(ids))
        context, new = ids[:cut], ids[cut:]
        expected = reference(tokenizer, context, new)
        assert "".join(streamed(tokenizer, context, new)) == expected, (context, new)
        assert "".join(decode_pieces(tokenizer, context, new)) == decode_completion(tokenizer, context, new) == expected


@pytest.mark.parametrize("layout", ["gpt2", "llama2", "metaspace-unigram", "bert", "tfcli-bpe", "tfcli-wordpiece", "tfcli-unigram"])
def test_transformers_decodes_the_same_text(layouts, layout):
    tokenizer = layouts[layout]
    theirs = transformers_tokenizer(tokenizer)
    rng = random.Random(layout)
    samples = [tokenizer.encode(text) for text in REAL_TEXTS] + [[rng.randrange(tokenizer.vocab_size) for _ in range(30)] for _ in range(30)]
    for ids in samples:
        cut = len(ids) // 2
        text = "".join(streamed(tokenizer, ids[:cut], ids[cut:]))
        prompt = theirs.decode(ids[:cut], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        full = theirs.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert full == tokenizer.hf.decode(ids, skip_special_tokens=True)
        inside_a_character = prompt.endswith("\ufffd") or ids[cut - 1] in tokenizer.byte_fallback_ids  # a byte run may go on
        assert prompt + text == full or inside_a_character


def test_llama2_continuation_keeps_the_space_before_its_first_word(layouts):
    tokenizer = layouts["llama2"]
    bos = tokenizer.special_ids["bos"]
    ids = tokenizer.encode("One day, they went to the beach. They saw a big box")
    cut = next(i for i in range(len(ids)) if tokenizer.decode(ids[:i]) == "One day, they went to the beach.")
    prompt, rest = ids[:cut], ids[cut:]
    assert tokenizer.hf.id_to_token(rest[0]).startswith("\u2581")  # the space is the next word's "▁"
    assert reference(tokenizer, [bos] + prompt, rest) == " They saw a big box"
    assert "".join(streamed(tokenizer, [bos] + prompt, rest)) == " They saw a big box"
    assert decode_completion(tokenizer, [bos], prompt) == "One day, they went to the beach."  # a text's first space is the decoder's to strip
    newline = tokenizer.hf.token_to_id("<0x0A>")
    # a newline is the byte piece <0x0A>: its text comes with the next token (a byte run ends there)
    assert decode_pieces(tokenizer, prompt, [newline, rest[0]]) == ["", "\n They"]


@pytest.mark.parametrize("layout", ["llama2", "gpt2"])
def test_a_split_character_waits_for_its_last_byte_and_a_bad_run_shows_as_the_decoder_writes_it(layouts, layout):
    tokenizer = layouts[layout]
    both = tokenizer.encode("Hi 東京!")
    cut = next(i for i in range(len(both)) if tokenizer.decode(both[:i]) == "Hi")
    context, ids = both[:cut], both[cut:]
    pieces = decode_pieces(tokenizer, context, ids)
    assert "".join(pieces) == " 東京!" and not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p) < len(ids)  # the bytes of a character wait for the last one
    if layout == "llama2":  # an invalid byte turns its whole run to U+FFFD, as ByteFallback writes it
        bad = [tokenizer.hf.token_to_id(f"<0x{b:02X}>") for b in "東".encode()] + [tokenizer.hf.token_to_id("<0x80>")] + tokenizer.encode("ok")
        assert "".join(streamed(tokenizer, context, bad)) == reference(tokenizer, context, bad) == "\ufffd" * 4 + " ok"


def test_a_byte_fallback_run_streams_when_it_ends_because_a_later_byte_can_void_it(layouts):
    """CJK and emoji written in byte pieces (<0xE4><0xB8><0xAD> is 中) come out when the run ends, whole and as
    the library decodes them. Not a character at a time: `ByteFallback` writes a run with any invalid byte as
    U+FFFD for every byte, so a character shown as soon as its bytes were complete would contradict the text
    once a later byte of the same run turned out invalid (a stream cannot take text back)."""
    tokenizer = layouts["llama2"]

    def pieces(data: bytes) -> list[int]:
        return [tokenizer.hf.token_to_id(f"<0x{b:02X}>") for b in data]

    context, word = tokenizer.encode("Lily said"), tokenizer.hf.token_to_id("\u2581was")
    cjk, emoji = pieces("中文字".encode()), pieces("🦊".encode())
    assert len(cjk) == 9 and len(emoji) == 4
    for run, text in ((cjk, "中文字"), (emoji, "🦊"), (cjk + emoji, "中文字🦊")):
        chunks = streamed(tokenizer, context, run + [word])
        assert chunks == [""] * len(run) + [f"{text} was", ""] and "".join(chunks) == reference(tokenizer, context, run + [word])
        assert "".join(streamed(tokenizer, context, run)) == text == reference(tokenizer, context, run)  # the text ends the run
    for invalid in (cjk + pieces(b"\x80"), cjk + pieces(b"\xe4"), pieces(b"\xe4") + cjk):
        expected = reference(tokenizer, context, invalid + [word])
        assert expected == "\ufffd" * len(invalid) + " was"  # the whole run, the three whole characters too
        assert "".join(streamed(tokenizer, context, invalid + [word])) == expected
        assert "".join(streamed(tokenizer, context, invalid)) == "\ufffd" * len(invalid) == reference(tokenizer, context, invalid)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bytes_per_token_add_up_to_the_texts_bytes(layouts, layout):
    """Bits per byte divide by these: summed over a text's tokens they are the bytes of its decoded text."""
    tokenizer = layouts[layout]
    lengths = text_byte_lengths(tokenizer)
    anchor = tokenizer.encode("a")[-1:]
    for text in REAL_TEXTS:
        ids = [i for i in tokenizer.encode(text) if i not in tokenizer.skipped_ids]
        between = tokenizer.hf.decode(anchor + ids + anchor)  # the text between two words, less those words
        assert sum(lengths[i] for i in ids) == len(between.encode("utf-8")) - len(tokenizer.hf.decode(anchor + anchor).encode("utf-8"))


@pytest.mark.parametrize("layout", ["gpt2", "llama2", "tfcli-wordpiece", "tfcli-char"])
def test_the_work_per_token_stays_bounded(layouts, layout, monkeypatch):
    tokenizer = layouts[layout]
    ids = tokenizer.encode(REAL_TEXTS[0] * 40)
    decoder = IncrementalDecoder(tokenizer, ids[:5])
    decoded_lengths = []
    decode = decoder._decode
    monkeypatch.setattr(decoder, "_decode", lambda window: decoded_lengths.append(len(window)) or decode(window))
    text = "".join(decoder.extend([i]) for i in ids[5:]) + decoder.finish()
    assert text == reference(tokenizer, ids[:5], ids[5:])
    assert max(decoded_lengths) <= WINDOW_TOKENS + 2  # never the whole text again (a newline is one byte token in Llama's)
    assert len(decoded_lengths) <= 1.2 * len(ids)  # about one short decode per token


def test_beam_forks_go_on_independently(layouts):
    tokenizer = layouts["llama2"]
    happy, sad = tokenizer.encode("Lily was happy"), tokenizer.encode("Lily was sad")
    common = next(i for i, (x, y) in enumerate(zip(happy, sad)) if x != y)
    context = happy[:1]
    text = CompletionText(tokenizer, context)
    for i in happy[1:common]:
        text.add(i)
    a, b = text.fork(), text.fork()
    for i in happy[common:]:
        a.add(i)
    for i in sad[common:]:
        b.add(i)
    a.finish(), b.finish(), text.finish()
    assert (a.text, b.text) == (reference(tokenizer, context, happy[1:]), reference(tokenizer, context, sad[1:])) == (" was happy", " was sad")
    assert text.text == reference(tokenizer, context, happy[1:common])


def test_layouts_folder_is_what_the_hub_ships(layouts, tmp_path: Path):
    """The Llama-2 layout loads in transformers' AutoTokenizer, adds <s> first, and byte-falls-back newlines."""
    transformers = _transformers()
    from tests.layouts import llama2_tokenizer

    folder = llama2_tokenizer(tmp_path / "llama")
    auto = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = auto("Once upon a time\nLily")["input_ids"]
    assert ids[0] == auto.bos_token_id == 1 and "<0x0A>" in auto.convert_ids_to_tokens(ids)
    assert auto.decode(ids, skip_special_tokens=True) == "Once upon a time\nLily"


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny random Llama saved by transformers with the Llama-2 tokenizer layout, and its `tfcli import`."""
    transformers = _transformers()
    import torch

    from tests.layouts import llama2_tokenizer
    from tfcli.hf.convert import import_hf

    folder = tmp_path_factory.mktemp("llama")
    hf_dir = llama2_tokenizer(folder / "hf")
    vocab = TextTokenizer.load(hf_dir).vocab_size
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(str(hf_dir), safe_serialization=True)
    import_hf(hf_dir, folder / "run")
    return hf_dir, folder / "run"


@pytest.mark.parametrize("prompt", ["Once upon a ti", "Once upon a time, there was ", "She loved to play outside.\n"])
def test_generate_on_an_imported_llama2_reads_as_transformers_decodes(cli, llama_run, prompt):
    """Mid-word, at a space, at a newline: the prompt and its completion read as AutoTokenizer decodes them."""
    transformers = _transformers()
    hf_dir, run = llama_run
    result = cli("generate", run, "-p", prompt, "-n", "24", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    auto = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    prompt_ids = auto(prompt)["input_ids"]
    assert prompt_ids[0] == auto.bos_token_id and completion["prompt_tokens"] == len(prompt_ids)
    assert auto.decode(prompt_ids, skip_special_tokens=True) == prompt
    assert prompt + completion["text"] == auto.decode(prompt_ids + completion["tokens"], skip_special_tokens=True)
    assert "".join(completion["token_texts"]) == completion["text"]
    printed = cli("generate", run, "-p", prompt, "-n", "24")
    assert printed.code == 0 and printed.stdout == completion["text"] + "\n"  # (the prompt is echoed on a terminal only)
    assert "\u2581" not in printed.stdout and "<0x" not in printed.stdout  # no raw SentencePiece pieces


def test_an_empty_prompt_starts_from_bos_where_the_tokenizer_adds_one(cli, llama_run):
    hf_dir, run = llama_run
    result = cli("generate", run, "-p", "", "-n", "8", "--json")
    assert result.code == 0, result.stderr
    (completion,) = json.loads(result.stdout)["completions"]
    assert completion["prompt_tokens"] == 1 and len(completion["tokens"]) == 8  # <s> alone: an unconditional sample
    assert completion["text"] == TextTokenizer.load(run).hf.decode([1] + completion["tokens"], skip_special_tokens=True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_views_read_as_the_decoder_writes_the_text(layouts, layout):
    """tokenize show and the inspect views: each token's text through the decoder, a split character on each
    token that holds part of it, never U+FFFD, and the pieces join to the decoder's text."""
    tokenizer = layouts[layout]
    for text in REAL_TEXTS:
        ids = tokenizer.encode(text)
        views = views_of_ids(tokenizer, ids)
        assert "".join(v.piece for v in views) == tokenizer.hf.decode(ids, skip_special_tokens=False)
        assert not any("\ufffd" in v.text for v in views), [v.text for v in views]
        assert all(v.part in ("", v.text[-1:]) for v in views)


def test_byte_fallback_pieces_read_as_the_characters_they_stand_for(layouts):
    tokenizer = layouts["llama2"]
    views = views_of_ids(tokenizer, tokenizer.encode("Lily said:\n你好 café"))
    assert [v.token for v in views][2:9] == ["<0x0A>", "<0xE4>", "<0xBD>", "<0xA0>", "<0xE5>", "<0xA5>", "<0xBD>"]
    assert [v.text for v in views] == ["Lily", " said:", "\\n", "你", "你", "你", "好", "好", "好", " café"]
    assert [v.piece for v in views][2:] == ["\n", "", "", "你", "", "", "好", " café"]
    assert [v.label for v in views] == ["Lily", "␣said:", "↵", "你", "你", "你", "好", "好", "好", "␣café"]
    labels = [token_label(tokenizer, tokenizer.hf.token_to_id(t)) for t in ("<0x0A>", "<0x09>", "<0xE4>", "\u2581said:", "\u2581", "</s>")]
    assert labels == ["↵", "\\t", "<0xE4>", "␣said:", "␣", "</s>"]  # alone: the text it adds after a word; a lone byte, its entry
    invalid = views_of_ids(tokenizer, [tokenizer.hf.token_to_id("<0x80>")] + tokenizer.encode("ok")[1:])
    assert [v.label for v in invalid][0] == "<0x80>"  # a byte that is no character: its entry, never U+FFFD


@pytest.mark.parametrize("layout", LAYOUTS)
def test_labels_mark_a_leading_space_the_same_in_every_layout(layouts, layout):
    """Tables, pictures and tokenize show: a token that starts a word after a space is labelled ␣word (or
    follows a token that is only the space, ␣), one inside a word has no mark; a newline is ↵, a tab \\t."""
    tokenizer = layouts[layout]
    text = "Lily was happy.\n\tThey  saw a big box"
    views = views_of_ids(tokenizer, tokenizer.encode(text))
    spelled, before = "", ""
    checked = set()
    for view in views:
        shown = view.piece + view.part
        if shown.strip() and "\ufffd" not in shown and not view.token.startswith(("[", "<")):
            word = spelled + view.piece.rstrip(" ")
            first = len(word) - len(view.piece.strip(" "))  # where its first visible character falls
            after_space = first > 0 and word[first - 1] == " "
            marked = view.readable.startswith("␣") or (not view.piece.startswith(" ") and before != "" and before.strip("␣") == "")
            assert marked == after_space, (view, spelled)
            checked.add(after_space)
        if shown in (" ", "\n", "\t"):
            assert view.readable == {" ": "␣", "\n": "↵", "\t": "\\t"}[shown]
            checked.add(shown)
        spelled, before = spelled + view.piece, view.readable
    assert checked >= {True, False}  # both kinds of token were seen
    if layout not in ("bert", "tfcli-wordpiece", "tfcli-bpe-whitespace", "metaspace-unigram"):  # they drop newlines
        assert "\n" in checked
    for token_id in tokenizer.encode("They saw"):
        label, text = token_label(tokenizer, token_id), token_text(tokenizer, token_id)
        assert label == text.replace(" ", "␣") and "␣" not in text  # JSON keeps the text unmarked


def _spaced_words(folder: Path) -> TextTokenizer:
    """Words joined by a space (no decoder: "don ' t"), and tokenizer_config.json asking for transformers'
    clean-up of spaces ("don't"); the vocabulary is every piece of the clean-up's patterns, so random ids
    make every pattern, whole and split, and chains (" n ' t" -> " n't" -> "n't")."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "a", "n", "n't", "'", "t", "s", "'s", "'m", "m", ".", ",", "?", "!", "ve", "'ve", "re", "'re", "x", "<s>"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>"])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"clean_up_tokenization_spaces": True}), encoding="utf-8")
    return TextTokenizer.load(folder)


def test_a_space_clean_up_streams_as_a_whole_decode_cleans_up(tmp_path):
    """tokenizer_config.json's clean_up_tokenization_spaces, as transformers' decode applies it after the
    decoder: the streamed pieces, in any grouping, join to the cleaned-up text, though a space the clean-up
    takes out shows only as later ids come (" n" may go on "'t"). After a context whose text ends in such a
    space, the space went out with the context; the rest is the whole decode's."""
    tokenizer = _spaced_words(tmp_path / "words")
    assert tokenizer.cleans_up_spaces
    word = tokenizer.hf.token_to_id
    ids = [word(w) for w in ["a", "n", "'", "t", "x", ",", "a", "'", "s", "!", "<s>", "a", "'", "re", "."]]
    assert tokenizer.hf.decode(ids, skip_special_tokens=False) == "a n ' t x , a ' s ! <s> a ' re ."  # the library alone
    assert tokenizer.decode(ids) == "an't x, a's! <s> a're." == transformers_tokenizer_of(tmp_path / "words").decode(ids)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "an't x, a's! a're."  # the library joins the words left
    assert decode_pieces(tokenizer, [word("a")], [word("n"), word("'"), word("t"), word("x")]) == ["", "", "n't", " x"]
    assert decode_pieces(tokenizer, [word("x")], [word(","), word("a"), word("?")]) == [",", " a", "?"]
    rng = random.Random(44)
    for _ in range(3000):
        context = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.choice([0, 0, 1, 3, 9]))]
        new = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(0, 30))]
        skip = rng.random() < 0.5
        decoder, chunks, at = IncrementalDecoder(tokenizer, context, skip_special_tokens=skip), [], 0
        while at < len(new):
            step = rng.randint(1, 3)
            chunks.append(decoder.extend(new[at : at + step]))
            at += step
        chunks.append(decoder.finish())
        whole, prompt = tokenizer.decode(context + new, skip_special_tokens=skip), tokenizer.decode(context, skip_special_tokens=skip)
        if whole.startswith(prompt):
            assert "".join(chunks) == whole[len(prompt) :], (context, new, chunks)
        else:  # the clean-up took out a space at the end of the context's text, given out already
            assert prompt.endswith(" ") or " n" in prompt[-3:] or " '" in prompt[-3:], (prompt, whole)
    views = views_of_ids(tokenizer, ids)  # tokenize show: each token's piece, joined, is the text
    assert "".join(view.piece for view in views) == tokenizer.decode(ids)


def transformers_tokenizer_of(folder: Path):
    """transformers' tokenizer of a folder, as AutoTokenizer reads it (tokenizer_config.json too)."""
    return _transformers().AutoTokenizer.from_pretrained(str(folder))


def test_settled_text_of_a_space_clean_up_never_changes():
    """`settled_length`: the start of the cleaned-up text that no text after it can change."""
    from tfcli.tokenizer.cleanup import clean_up_spaces, settled_length

    assert settled_length("a , b n") == 4 and clean_up_spaces("a , b n") == "a, b n"
    rng = random.Random(7)
    alphabet = [" ", "n", "'", "t", ".", ",", "s", "m", "v", "e", "r", "x", "?", "!"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        after = "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
        settled = settled_length(text)
        assert settled <= len(clean_up_spaces(text))
        assert clean_up_spaces(text + after)[:settled] == clean_up_spaces(text)[:settled], (text, after)
