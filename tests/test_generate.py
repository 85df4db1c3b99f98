"""`tfcli generate`: decoding over the KV cache equals decoding without it, beam search with one beam equals
greedy, batched prompts decode as they would alone, streaming never shows half a character, and every
option of the command works or fails with one clear line."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import torch

from tfcli.checkpoint import load_checkpoint, save_checkpoint
from tfcli.generate.conversation import Conversation
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Chunk, Done, Finished, Notice
from tfcli.generate.settings import GenerationSettings
from tfcli.generate.stream import CompletionText
from tfcli.generate.window import DecoderWindow, Vocabulary
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.tokenizer.core import TextTokenizer
from tfcli.tokenizer.fast import byte_of_symbol

PROMPTS = ["Once upon a time", "The fox", "Tom had three apples. He gave one to"]


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=320, block_size=32, n_layers=2, n_heads=4, d_model=32, d_ff=64)
    return ModelConfig(**{**base, **overrides})


def make_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny(**overrides)).eval()


@pytest.fixture(scope="session")
def tokenizer(trained_tokenizer) -> TextTokenizer:
    return TextTokenizer.load(trained_tokenizer)


@pytest.fixture(scope="session")
def runs(tmp_path_factory, tokenizer):
    """Run directories with random weights: a decoder, an encoder (masked LM), an encoder-decoder, and two
    classifiers (an encoder whose labels are named, a decoder whose labels are not)."""
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name, options, training in [
        ("decoder", dict(arch="decoder"), None),
        ("encoder", dict(arch="encoder"), None),
        ("seq2seq", dict(arch="encoder-decoder", positions="sinusoidal"), None),
        ("classifier", dict(arch="encoder", n_classes=3), {"task": "classify", "labels": ["negative", "neutral", "positive"]}),
        ("decoder-classifier", dict(arch="decoder", n_classes=2), None),
    ]:
        save_checkpoint(root / name, make_model(**options), tokenizer, training=training)
        made[name] = root / name
    return made


def run_all(generator: Generator, prompts) -> tuple[list, Done]:
    events = list(generator.run(prompts))
    assert isinstance(events[-1], Done)
    return events, events[-1]


def completions(model, tokenizer, prompts=PROMPTS, **settings) -> list[list[int]]:
    _, done = run_all(Generator(model, tokenizer, GenerationSettings(**settings)), prompts)
    return [c.tokens for c in done.completions]


def byte_ids(tokenizer: TextTokenizer, data: bytes) -> list[int]:
    """One token per byte (a byte-level vocabulary has all 256), so a character can be split on purpose."""
    to_char = {b: ch for ch, b in byte_of_symbol().items()}
    return [tokenizer.hf.token_to_id(to_char[b]) for b in data]


class ScriptedHead(torch.nn.Module):
    """Stands in for the LM head: each call makes the next id of a script (almost) certain."""

    def __init__(self, script: list[int], weight: torch.Tensor) -> None:
        super().__init__()
        self.script, self.calls, self.weight = script, 0, weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        logits = torch.zeros(hidden.shape[0], self.weight.shape[0])
        logits[:, token] = 30.0
        return logits


def scripted(model: Transformer, script: list[int]) -> Transformer:
    model.lm_head = ScriptedHead(script, model.tok_emb.weight)
    return model


# -- sampling helpers, on hand-made logits ---------------------------------------------------------------


def test_top_k_keeps_the_k_largest():
    from tfcli.generate.sampling import top_k_filter

    out = top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2)
    assert out.tolist() == [[float("-inf"), 3.0, 2.0, float("-inf")]]
    assert top_k_filter(torch.tensor([[1.0, 2.0]]), 0).tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize("p, kept", [(0.4, 1), (0.7, 2), (0.8, 2), (0.81, 3), (1.0, 4)])
def test_top_p_keeps_the_nucleus(p, kept):
    from tfcli.generate.sampling import top_p_filter

    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()  # sorted: 0.5, 0.3, 0.15, 0.05
    out = top_p_filter(logits, p)
    survivors = torch.isfinite(out[0]).nonzero().flatten().tolist()
    assert len(survivors) == kept
    assert survivors == sorted([1, 3, 0, 2][:kept])  # the most likely first
    assert torch.equal(out[0, survivors], logits[0, survivors])


def test_min_p_drops_tokens_far_below_the_best():
    from tfcli.generate.sampling import min_p_filter

    logits = torch.tensor([[0.6, 0.3, 0.1]]).log()
    assert torch.isfinite(min_p_filter(logits, 0.25)).tolist() == [[True, True, False]]  # threshold 0.15
    assert torch.isfinite(min_p_filter(logits, 0.6)).tolist() == [[True, False, False]]  # threshold 0.36


def test_temperature_sharpens_and_flattens():
    from tfcli.generate.sampling import filtered_logits

    logits = torch.tensor([[2.0, 1.0, 0.0]])
    assert filtered_logits(logits, temperature=0.5).tolist() == [[4.0, 2.0, 0.0]]
    hot = torch.softmax(filtered_logits(logits, temperature=10.0), -1)
    cold = torch.softmax(filtered_logits(logits, temperature=0.1), -1)
    assert hot.max() < 0.4 < 0.99 < cold.max()


def test_repetition_penalty_lowers_seen_tokens_either_sign():
    from tfcli.generate.sampling import apply_repetition_penalty

    logits = torch.tensor([[2.0, -1.0, 3.0]])
    seen = torch.tensor([[True, True, False]])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [[1.0, -2.0, 3.0]]
    assert apply_repetition_penalty(logits, seen, 1.0) is logits


def test_sampling_draws_only_what_the_filters_keep_in_proportion():
    from tfcli.generate.sampling import choose_next

    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(4000, 1)
    rng = torch.Generator().manual_seed(0)
    drawn = choose_next(logits, greedy=False, top_k=2, generator=rng)
    counts = torch.bincount(drawn, minlength=4).tolist()
    assert counts[2] == counts[3] == 0
    assert counts[0] / 4000 == pytest.approx(0.5 / 0.8, abs=0.03)
    assert choose_next(logits[:1], greedy=True).tolist() == [0]
    assert choose_next(logits[:1], greedy=False, temperature=0).tolist() == [0]  # temperature 0 is argmax
    again = choose_next(logits, greedy=False, top_k=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(drawn, again)


# -- streaming text ----------------------------------------------------------------------------------------


def test_held_back_is_the_longest_possible_stop_start():
    from tfcli.generate.stream import held_back

    assert held_back("Hello wor", ["world", "x"]) == 3
    assert held_back("Hello", ["world"]) == 0
    assert held_back("ab", ["abc", "bcd"]) == 2


def test_a_character_split_across_tokens_streams_whole(tokenizer):
    ids = byte_ids(tokenizer, "a🦊é b".encode())
    text = CompletionText(tokenizer)
    chunks = [text.add(i) for i in ids] + [text.finish()]
    assert "".join(chunks) == text.text == "a🦊é b"
    assert all("\ufffd" not in c for c in chunks)
    assert chunks[1:5] == ["", "", "", "🦊"]  # nothing until the emoji's fourth byte


def test_a_stop_string_is_cut_and_never_shown(tokenizer):
    text = CompletionText(tokenizer, stops=["world", "zz"])
    chunks = [text.add(i) for i in byte_ids(tokenizer, b"Hello world. Bye")]
    chunks.append(text.finish())
    assert text.stopped and text.text == "Hello "
    assert "".join(chunks) == "Hello "
    assert not any("w" in c for c in chunks)


# -- decoding equivalences -----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_cached_greedy_equals_uncached_greedy_even_past_the_context(tokenizer, arch, positions):
    model = make_model(arch=arch, positions=positions, n_kv_heads=2)
    cached = completions(model, tokenizer, max_new_tokens=50, stop_at_eos=False)  # 10 + 50 tokens > block 32
    uncached = completions(model, tokenizer, max_new_tokens=50, stop_at_eos=False, use_cache=False)
    assert cached == uncached
    assert all(len(c) == 50 for c in cached)


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_beam_search_with_one_beam_is_greedy(tokenizer, arch):
    model = make_model(arch=arch)
    greedy = completions(model, tokenizer, max_new_tokens=20)
    beam = completions(model, tokenizer, max_new_tokens=20, strategy="beam", num_beams=1)
    assert beam == greedy


def test_beam_search_reaches_the_decoder_through_its_protocol_only():
    import ast
    import inspect

    import tfcli.generate.beam as beam

    tree = ast.parse(inspect.getsource(beam))
    private = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")]
    private = [name for name in private if not (name in dir(beam._Search) or name == "_events")]
    assert not private, private  # only its own helpers
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "tfcli.generate.decoding" not in imported


def test_beam_search_with_every_token_as_a_beam_finds_the_best_pair(tokenizer):
    model = make_model(seed=3)
    prompt = tokenizer.encode("The fox")
    vocab = Vocabulary.of(tokenizer, 320)
    allowed = [t for t in range(320) if t not in vocab.suppressed]
    with torch.inference_mode():  # brute force: every first token, then every second one (specials never chosen)
        first = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1, allowed], -1)
        rows = torch.tensor([prompt + [t] for t in allowed])
        second = torch.log_softmax(model(rows).logits[:, -1, allowed], -1)  # (first, second)
        totals = first.unsqueeze(1) + second
    best = divmod(int(totals.argmax()), len(allowed))
    settings = GenerationSettings(strategy="beam", num_beams=len(allowed), max_new_tokens=2, stop_at_eos=False, length_penalty=0.0)
    _, done = run_all(Generator(model, tokenizer, settings, batch_size=1), ["The fox"])
    assert done.completions[0].tokens == [allowed[best[0]], allowed[best[1]]]
    assert done.completions[0].score == pytest.approx(totals.max().item(), abs=1e-4)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_batched_left_padded_prompts_decode_as_they_would_alone(tokenizer, positions, strategy):
    model = make_model(positions=positions)
    options = dict(max_new_tokens=10, stop_at_eos=False, strategy=strategy, num_beams=2 if strategy == "beam" else 1)
    lengths = [len(tokenizer.encode(p)) for p in PROMPTS]
    assert len(set(lengths)) == 3  # three lengths: two rows are padded
    batched = completions(model, tokenizer, **options)
    alone = [completions(model, tokenizer, [p], **options)[0] for p in PROMPTS]
    assert batched == alone


def test_the_window_slides_by_rerunning_its_last_tokens(tokenizer):
    model = make_model(positions="rotary")
    vocab = Vocabulary.of(tokenizer, 320)
    window = DecoderWindow(model, 1, vocab, keep=20)
    ids = torch.randint(5, 320, (1, 32))
    with torch.inference_mode():
        window.start(ids, torch.ones_like(ids, dtype=torch.bool))
        logits = window.push(torch.tensor([7]))  # the window is full: slide
        assert window.slides == 1 and window.length == 20 and window.cache.length == 20
        kept = torch.cat([ids[:, -19:], torch.tensor([[7]])], dim=1)
        fresh = model(kept).logits[:, -1]
        fresh[:, vocab.suppressed] = float("-inf")
    torch.testing.assert_close(logits, fresh, atol=1e-5, rtol=1e-5)


def test_a_model_vocabulary_larger_than_the_tokenizer_is_never_sampled_beyond_it(tokenizer):
    model = make_model(vocab_size=400)
    with torch.no_grad():
        model.lm_head.weight[320:] *= 50  # make the ids the tokenizer lacks the most likely
    settings = GenerationSettings(strategy="sample", temperature=2.0, max_new_tokens=40, num_samples=4, seed=0, stop_at_eos=False)
    _, done = run_all(Generator(model, tokenizer, settings), PROMPTS)
    drawn = {t for c in done.completions for t in c.tokens}
    assert drawn and max(drawn) < 320
    assert not drawn & {1, 2, 3, 4}  # pad, unk, mask and cls are never generated


def test_encoder_decoder_encodes_the_source_once_and_cross_keys_once(tokenizer):
    for strategy, beams in (("greedy", 1), ("beam", 3)):
        model = make_model(arch="encoder-decoder")
        calls = {"encode": 0, "cross_kv": 0}
        encode = model.encode

        def counting_encode(*args, calls=calls, encode=encode, **kwargs):
            calls["encode"] += 1
            return encode(*args, **kwargs)

        model.encode = counting_encode
        for block in model.decoder.blocks:
            block.cross_attn.kv.register_forward_hook(lambda *_, calls=calls: calls.__setitem__("cross_kv", calls["cross_kv"] + 1))
        settings = GenerationSettings(strategy=strategy, num_beams=beams, max_new_tokens=12, stop_at_eos=False)
        _, done = run_all(Generator(model, tokenizer, settings), ["The fox found a ball"])
        assert len(done.completions[0].tokens) == 12
        assert calls == {"encode": 1, "cross_kv": 2}  # one encoder pass; each of 2 layers projects the memory once


# -- events, stops, samples ----------------------------------------------------------------------------


def test_streamed_chunks_concatenate_to_the_text_through_the_loop(tokenizer):
    script = byte_ids(tokenizer, "Hi 🦊 there".encode()) + [0]
    model = scripted(make_model(), script)
    events, done = run_all(Generator(model, tokenizer, GenerationSettings(max_new_tokens=50, logprobs=True)), ["x"])
    chunks = [e.text for e in events if isinstance(e, Chunk)]
    assert "".join(chunks) == done.completions[0].text == "Hi 🦊 there"
    assert all("\ufffd" not in c for c in chunks)
    c = done.completions[0]
    assert c.finish_reason == "eos" and c.tokens == script[:-1]  # the eos id is not part of the text
    assert len(c.logprobs) == len(c.tokens) and all(-1e-3 < lp <= 0 for lp in c.logprobs)


def test_stop_strings_end_the_text_in_every_strategy(tokenizer):
    script = byte_ids(tokenizer, b"one two. three")
    for strategy, beams in (("greedy", 1), ("beam", 2)):
        model = scripted(make_model(), script)
        settings = GenerationSettings(strategy=strategy, num_beams=beams, max_new_tokens=50, stop=(".", "zzz"))
        events, done = run_all(Generator(model, tokenizer, settings), ["x"])
        assert done.completions[0].text == "one two" and done.completions[0].finish_reason == "stop"
        assert "".join(e.text for e in events if isinstance(e, Chunk)) == "one two"


def test_num_samples_and_seeds(tokenizer):
    model = make_model()
    options = dict(strategy="sample", max_new_tokens=15, num_samples=3, top_k=50)
    first = completions(model, tokenizer, ["The fox"], seed=5, **options)
    assert len(first) == 3 and len({tuple(c) for c in first}) > 1
    assert completions(model, tokenizer, ["The fox"], seed=5, **options) == first
    assert completions(model, tokenizer, ["The fox"], seed=6, **options) != first


def test_a_long_prompt_keeps_its_end_with_a_notice(tokenizer):
    model = make_model()
    long_prompt = "The fox found a red ball. " * 20
    events, done = run_all(Generator(model, tokenizer, GenerationSettings(max_new_tokens=5)), [long_prompt])
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "keeping the last 32" in notices[0]
    assert done.completions[0].prompt_tokens == 32
    kept = tokenizer.encode(long_prompt)[-32:]
    again = list(Generator(model, tokenizer, GenerationSettings(max_new_tokens=5)).run_ids([kept]))[-1]
    assert again.completions[0].tokens == done.completions[0].tokens  # the same as the prompt's last 32 tokens


def test_a_conversation_keeps_every_turn_in_context_and_reuses_the_cache(tokenizer):
    model = make_model(block_size=128)
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False)
    conversation = Conversation(Generator(model, tokenizer, settings))
    first = [e for e in conversation.reply("Hello fox") if isinstance(e, Finished)][0].result
    second = [e for e in conversation.reply("Where is the ball?") if isinstance(e, Finished)][0].result
    assert conversation.reused > 0  # the first turn's tokens were still in the cache
    history_before_second = tokenizer.encode("Hello fox\n") + tokenizer.encode(first.text + "\n") + tokenizer.encode("Where is the ball?\n")
    fresh = list(Generator(model, tokenizer, settings).run_ids([history_before_second]))[-1]
    assert second.tokens == fresh.completions[0].tokens  # the same reply as from the whole history at once
    conversation.reset()
    assert conversation.history == []
    assert not [e for e in conversation.reply("Hello fox") if isinstance(e, Notice)]
    long_line = "The fox found a red ball in the park. " * 20
    notices = [e.message for e in conversation.reply(long_line) if isinstance(e, Notice)]
    assert len(notices) == 1 and "more than the context keeps (96)" in notices[0]  # the window keeps 3/4 of 128 after a slide


# -- fill-mask and classify (library) ----------------------------------------------------------------------


def test_fill_mask_lists_likely_tokens_per_mask(runs):
    from tfcli.generate.masked import fill_mask

    checkpoint = load_checkpoint(runs["encoder"])
    predictions = fill_mask(checkpoint.model, checkpoint.tokenizer, "The [MASK] sat on the <|mask|>", top_k=4)
    assert [p.position for p in predictions] == [0, 1]
    for p in predictions:
        probabilities = [f.probability for f in p.fillers]
        assert len(p.fillers) == 4 and probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1
        assert all(f.token_id not in checkpoint.tokenizer.special_ids.values() for f in p.fillers)
    first, second = predictions[0].fillers[0], predictions[1].fillers[0]
    assert first.text == f"The{first.token} sat on the [MASK]"  # the space before a mask goes to the filler
    assert second.text == f"The [MASK] sat on the{second.token}"
    (every,) = fill_mask(checkpoint.model, checkpoint.tokenizer, "The [MASK] sat", top_k=10**6)  # more than the vocabulary
    specials = set(checkpoint.tokenizer.special_ids.values())
    assert len(every.fillers) == checkpoint.tokenizer.vocab_size - len(specials)
    assert not {f.token_id for f in every.fillers} & specials


def test_fill_mask_text_with_a_whitespace_tokenizer_has_single_spaces(tmp_path, tiny_corpus):
    from tfcli.corpus.reader import resolve_corpus
    from tfcli.generate.masked import fill_mask
    from tfcli.model.config import preset
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer.train import train_tokenizer
    from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

    train_tokenizer(resolve_corpus([tiny_corpus]), tmp_path / "tok", TokenizerTrainingConfig(vocab_size=200, pre_tokenizer="whitespace"))
    tokenizer = TextTokenizer.load(tmp_path / "tok")
    model = Transformer(preset("tiny", arch="encoder", vocab_size=tokenizer.vocab_size, block_size=32, d_model=16, n_heads=2)).eval()
    for prediction in fill_mask(model, tokenizer, "The fox [MASK] the ball, [MASK]", top_k=5):
        for f in prediction.fillers:
            assert "  " not in f.text and not f.text.endswith(" "), f.text


# -- the command line ----------------------------------------------------------------------------------


def test_cli_streams_the_text_and_no_stream_prints_the_same(cli, runs):
    streamed = cli("generate", runs["decoder"], "--prompt", "Once upon a time", "-n", "12")
    assert streamed.code == 0, streamed.stderr
    printed = cli("generate", runs["decoder"], "--prompt", "Once upon a time", "-n", "12", "--no-stream")
    data = json.loads(cli("generate", runs["decoder"], "--prompt", "Once upon a time", "-n", "12", "--json").stdout)
    assert streamed.stdout == printed.stdout == data["completions"][0]["text"] + "\n"
    assert "tokens/s" in streamed.stderr


def test_cli_says_up_front_when_asked_for_more_than_ten_contexts(cli, runs):
    """Allowed (the window slides for as long as asked), but a typo in --max-new-tokens shows before it runs."""
    many = cli("generate", runs["decoder"], "-p", "The fox", "-n", "321", "--ignore-eos", "--json")  # the context is 32 tokens
    assert many.code == 0, many.stderr
    assert many.stderr.splitlines()[0] == (
        "note: --max-new-tokens 321 is 10x the context (32 tokens): past the context the window "
        "slides and decoding goes on for as long as asked (Ctrl-C stops it)"
    )
    assert len(json.loads(many.stdout)["completions"][0]["tokens"]) == 321
    enough = cli("generate", runs["decoder"], "-p", "The fox", "-n", "320", "--ignore-eos", "--json")
    assert enough.code == 0 and "note:" not in enough.stderr


def test_cli_json_gives_text_ids_logprobs_and_timing(cli, runs, tokenizer):
    result = cli("generate", runs["decoder"], "-p", "The fox", "-n", "8", "--strategy", "sample", "--seed", "3", "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    (c,) = data["completions"]
    assert set(c) >= {"text", "tokens", "token_texts", "logprobs", "finish_reason", "prompt", "prompt_tokens"}
    assert len(c["tokens"]) == len(c["logprobs"]) == len(c["token_texts"]) <= 8
    assert all(lp <= 0 for lp in c["logprobs"])
    assert c["prompt_tokens"] == len(tokenizer.encode("The fox"))
    assert data["settings"]["seed"] == 3 and data["settings"]["strategy"] == "sample"
    assert set(data["timing"]) >= {"prefill_seconds", "decode_seconds", "tokens_per_second", "new_tokens"}
    again = json.loads(cli("generate", runs["decoder"], "-p", "The fox", "-n", "8", "--strategy", "sample", "--seed", "3", "--json").stdout)
    assert again["completions"][0]["tokens"] == c["tokens"]


def test_cli_sampling_options_imply_sampling_and_a_seed_is_reported(cli, runs):
    data = json.loads(
        cli(
            "generate",
            runs["decoder"],
            "-p",
            "The fox",
            "-n",
            "4",
            "--top-p",
            "0.9",
            "--min-p",
            "0.01",
            "--repetition-penalty",
            "1.3",
            "--temperature",
            "0.8",
            "--json",
        ).stdout
    )
    assert data["settings"]["strategy"] == "sample" and isinstance(data["settings"]["seed"], int)


def test_cli_prompt_file_batches_and_matches_one_by_one(cli, runs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\ufeff" + "\n".join(PROMPTS) + "\n\n", encoding="utf-8")  # a byte-order mark is not text
    batched = json.loads(cli("generate", runs["decoder"], "--prompt-file", prompts, "-n", "10", "--json").stdout)
    assert [c["prompt"] for c in batched["completions"]] == PROMPTS
    for prompt, completion in zip(PROMPTS, batched["completions"]):
        alone = json.loads(cli("generate", runs["decoder"], "-p", prompt, "-n", "10", "--json").stdout)
        assert alone["completions"][0]["tokens"] == completion["tokens"]
    text = cli("generate", runs["decoder"], "--prompt-file", prompts, "-n", "10")
    assert text.code == 0 and text.stdout.count("[prompt ") == 3


def test_cli_prompts_from_stdin_with_samples(cli, runs, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"The fox\nTom had\n")))
    data = json.loads(cli("generate", runs["decoder"], "--prompt-file", "-", "-n", "5", "--num-samples", "2", "--seed", "1", "--json").stdout)
    assert [(c["prompt_index"], c["sample_index"]) for c in data["completions"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_cli_beam_search_returns_the_best_hypotheses(cli, runs):
    data = json.loads(
        cli(
            "generate",
            runs["decoder"],
            "-p",
            "The fox",
            "-n",
            "6",
            "--num-beams",
            "4",
            "--num-samples",
            "3",
            "--length-penalty",
            "0.5",
            "--no-early-stopping",
            "--json",
        ).stdout
    )
    scores = [c["score"] for c in data["completions"]]
    assert data["settings"]["strategy"] == "beam" and len(scores) == 3 and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("options", [[], ["--strategy", "sample", "--seed", "1", "--num-samples", "2"], ["--num-beams", "3"]])
def test_cli_seq2seq_decodes_from_the_source(cli, runs, options):
    result = cli("generate", runs["seq2seq"], "-p", "12 March 2020", "-n", "6", "--json", *options)
    assert result.code == 0, result.stderr
    completions = json.loads(result.stdout)["completions"]
    assert completions and all(c["prompt"] == "12 March 2020" and len(c["tokens"]) <= 6 for c in completions)


def test_cli_stop_and_eos_with_a_scripted_model(cli, runs, tokenizer, monkeypatch):
    import tfcli.cli.generate as command

    load = command._load
    script = byte_ids(tokenizer, "Hi 🦊 there.\nNext".encode()) + [0]
    monkeypatch.setattr(command, "_load", lambda run, device, threads=0: _with_script(load(run, device, threads), script))
    assert cli("generate", runs["decoder"], "-p", "x", "-n", "40").stdout == "Hi 🦊 there.\nNext\n"
    stopped = cli("generate", runs["decoder"], "-p", "x", "-n", "40", "--stop", "\n", "--json")
    completion = json.loads(stopped.stdout)["completions"][0]
    assert (completion["text"], completion["finish_reason"]) == ("Hi 🦊 there.", "stop")
    ended = json.loads(cli("generate", runs["decoder"], "-p", "x", "-n", "40", "--json").stdout)["completions"][0]
    assert ended["finish_reason"] == "eos" and ended["text"] == "Hi 🦊 there.\nNext"


def test_cli_ignore_eos_goes_on_past_the_end_of_text(cli, runs, tokenizer, monkeypatch):
    import tfcli.cli.generate as command

    load = command._load
    eos = tokenizer.special_ids["eos"]
    script = byte_ids(tokenizer, b"Hi.") + [eos] + byte_ids(tokenizer, b"More")  # then "e" again and again
    monkeypatch.setattr(command, "_load", lambda run, device, threads=0: _with_script(load(run, device, threads), script))
    ended = json.loads(cli("generate", runs["decoder"], "-p", "x", "-n", "10", "--json").stdout)["completions"][0]
    assert (ended["text"], ended["finish_reason"]) == ("Hi.", "eos")
    result = cli("generate", runs["decoder"], "-p", "x", "-n", "10", "--ignore-eos", "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    went_on = data["completions"][0]
    # the end-of-text token is special: its text is left out, as transformers' decode(skip_special_tokens=True) does
    assert (went_on["text"], went_on["finish_reason"]) == ("Hi.Moreee", "length")
    assert went_on["tokens"][3] == eos and data["settings"]["stop_at_eos"] is False


def test_cli_decodes_past_the_context_by_sliding_the_window(cli, runs):
    args = ["generate", runs["decoder"], "-p", "The fox", "-n", "70", "--ignore-eos", "--json"]  # block 32: it slides
    cached, uncached = (json.loads(cli(*args, *extra).stdout)["completions"][0] for extra in ([], ["--no-cache"]))
    assert len(cached["tokens"]) == 70 and cached["finish_reason"] == "length"
    assert cached["tokens"] == uncached["tokens"]


def test_cli_reads_prompts_from_a_pipe(cli, runs, tmp_path):
    """`--prompt-file <(...)` hands over a pipe, not a regular file."""
    import os
    import threading

    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w", encoding="utf-8") as handle:
            handle.write("The fox\nA ball\n")

    writer = threading.Thread(target=feed)
    writer.start()
    result = cli("generate", runs["decoder"], "--prompt-file", fifo, "-n", "3", "--json")
    writer.join()
    assert result.code == 0, result.stderr
    assert [c["prompt"] for c in json.loads(result.stdout)["completions"]] == ["The fox", "A ball"]


def _with_script(checkpoint, script):
    scripted(checkpoint.model, script)
    return checkpoint


def test_cli_long_prompt_warns_on_stderr(cli, runs):
    result = cli("generate", runs["decoder"], "-p", "The fox found a red ball. " * 20, "-n", "3")
    assert result.code == 0 and "warning:" in result.stderr and "keeping the last 32" in result.stderr


def test_cli_interactive_conversation_on_stdin(cli, runs, monkeypatch):
    typed = b"Hello fox\n\ncaf\xe9\n/reset\nWhere is the ball?\n/quit\nnot read\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(typed)))
    result = cli("generate", runs["decoder"], "--interactive", "-n", "5", "--stop", "zzz")
    assert result.code == 0, result.stderr
    assert result.stdout.count("\n") == 2  # two replies; the blank line, the line that is not UTF-8 and the commands get none
    assert "forgotten" in result.stderr
    assert "that line is not UTF-8 text (byte 3); type it again" in result.stderr and "Traceback" not in result.stderr


def test_cli_fill_mask(cli, runs):
    result = cli("generate", runs["encoder"], "--fill-mask", "The [MASK] sat on the mat", "--top-k", "3", "--json")
    assert result.code == 0, result.stderr
    (mask,) = json.loads(result.stdout)["masks"]
    assert len(mask["fillers"]) == 3 and all("sat on the mat" in f["text"] for f in mask["fillers"])
    table = cli("generate", runs["encoder"], "--fill-mask", "The [MASK] sat on the mat")
    assert table.code == 0 and "probability" in table.stdout


@pytest.mark.parametrize("run, labels", [("classifier", ["negative", "neutral", "positive"]), ("decoder-classifier", ["class 0", "class 1"])])
def test_cli_classify(cli, runs, run, labels):
    result = cli("generate", runs[run], "--classify", "What a lovely film", "--json")
    assert result.code == 0, result.stderr
    ranked = json.loads(result.stdout)["labels"]
    assert sorted(r["label"] for r in ranked) == sorted(labels)
    assert sum(r["probability"] for r in ranked) == pytest.approx(1.0, abs=1e-4)
    assert [r["probability"] for r in ranked] == sorted((r["probability"] for r in ranked), reverse=True)
    assert labels[0] in cli("generate", runs[run], "--classify", "What a lovely film").stdout
    long = cli("generate", runs[run], "--classify", "What a lovely film. " * 200)
    assert long.code == 0 and "more than the context" in long.stderr and "classifying its first" in long.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "hi", "--run-missing"], "No such option"),
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--prompt", "hi", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--prompt", "hi", "--num-beams", "3", "--strategy", "sample"], "needs --strategy beam"),
        (["--prompt", "hi", "--num-beams", "3", "--temperature", "0.7"], "beam search does not sample"),
        (["--prompt", "hi", "--num-samples", "2"], "greedy decoding gives the same text"),
        (["--prompt", "hi", "--strategy", "nucleus"], "unknown strategy"),
        (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be between 1 and 1,000,000,000, not 0"),
        (["--prompt", "hi", "--stop", ""], "a --stop string is empty"),
        (["--prompt", "hi", "--length-penalty", "2"], "beam-search options"),
        (["--fill-mask", "The [MASK] sat"], "needs an encoder run"),
        (["--classify", "nice"], "no classification head"),
        (["--prompt", "hi", "--interactive"], "do not go together"),
        (["--interactive", "--json"], "not JSON"),
        ([], "nothing to do"),
        (["--prompt-file", "/nonexistent/prompts.txt"], "does not exist"),
        (["--prompt-file", "/"], "is a folder"),
        (["--prompt", "hi", "--num-beams", "2", "--length-penalty", "nan"], "--length-penalty must be between -10 and 10"),
        (["--prompt", "hi", "--num-beams", "2", "--length-penalty", "inf", "--json"], "--length-penalty must be between -10 and 10"),
        (["--prompt", "hi", "--device", "tpu"], "unknown device"),
        (["--prompt", "hi", "--seed", str(2**64)], "--seed must fit in 64 bits"),
        (["--prompt", "caf\udce9"], "the prompt is not UTF-8 text"),  # how a Latin-1 byte in argv arrives
    ],
)
def test_cli_bad_inputs_are_one_line(cli, runs, args, message):
    result = cli("generate", runs["decoder"], *args)
    assert result.code == 2, (result.stdout, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_binary_prompt_file_is_refused(cli, runs, tmp_path, monkeypatch):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"The fox\x00\x00\x01\x02 jumped\n")  # valid UTF-8, but NUL bytes: not a text file
    result = cli("generate", runs["decoder"], "--prompt-file", binary)
    assert result.code == 2 and f"{binary} looks like a binary file (it holds NUL bytes)" in result.stderr
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(binary.read_bytes())))
    result = cli("generate", runs["decoder"], "--prompt-file", "-")
    assert result.code == 2 and "stdin looks like a binary file" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "run, args, message",
    [
        ("missing", ["--prompt", "hi"], "does not exist"),
        ("encoder", ["--prompt", "hi"], "use --fill-mask"),
        ("encoder", ["--fill-mask", "no mask here"], "has no [MASK]"),
        ("seq2seq", ["--interactive"], "needs a decoder run"),
        ("seq2seq", ["--fill-mask", "The [MASK] sat"], "use --prompt SOURCE to write its target"),
        ("encoder", ["--fill-mask", "The [MASK] sat", "--temperature", "0.5"], "--temperature does not apply to --fill-mask"),
        ("encoder", ["--fill-mask", "The [MASK] sat", "--num-beams", "3"], "--num-beams does not apply to --fill-mask"),
        ("classifier", ["--classify", "nice", "--top-k", "3"], "--top-k does not apply to --classify"),
        ("classifier", ["--classify", " "], "pass some text with --classify"),
        ("classifier", ["--classify", "caf\udce9"], "--classify's text is not UTF-8 text"),
        ("encoder", ["--fill-mask", "The [MASK] caf\udce9"], "--fill-mask's text is not UTF-8 text"),
    ],
)
def test_cli_bad_runs_are_one_line(cli, runs, tmp_path, monkeypatch, run, args, message):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    path = tmp_path / "nowhere" if run == "missing" else runs[run]
    result = cli("generate", path, *args)
    assert result.code == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_generated_text_on_a_terminal_cannot_send_escapes():
    from tfcli.cli.generate import terminal_safe

    assert terminal_safe("a\x1b[2Jb\n\tc\u202e") == "a\\x1b[2Jb\n\tc\\u202e"


def test_generate_help_does_not_import_torch():
    code = "import sys\nfrom tfcli.cli.app import main\ntry:\n    main(['generate', '--help'])\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False" and "--fill-mask" in out


class _ReadsFromTheDevice:
    """Counts the reads of a tensor's values back to the host (each one a GPU-to-CPU copy and a wait on a GPU)
    while `counting` is set: .item(), .tolist(), .cpu(), .numpy(), int(), float(), bool()."""

    METHODS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self, monkeypatch) -> None:
        self.counting, self.reads = False, []
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))

    def _counted(self, name, method):
        def counted(tensor, *args, **kwargs):
            if self.counting:
                self.reads.append(name)
            return method(tensor, *args, **kwargs)

        return counted


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_one_rows_faster_step_reads_each_new_token_from_the_device_once(tokenizer, monkeypatch, strategy):
    """The loop reads each chosen token back once (to emit it, and to stop at end-of-text); the window hands that
    same number to a faster step (the C step, the compiled one), rather than reading it from the device again."""
    model = make_model()

    class PlainStep:  # a faster step's interface (a number in, the logits out), computed by the model itself
        def __init__(self, bound_model, cache) -> None:
            self.model, self.cache, self.tokens = bound_model, cache, []

        def usable(self) -> bool:
            return True

        def __call__(self, token: int) -> torch.Tensor:
            assert type(token) is int
            self.tokens.append(token)
            return self.model.unembed(self.model.decode(torch.tensor([[token]]), cache=self.cache)[:, -1])

    steps = []
    model.fast_decode_step = lambda bound_model, cache: steps.append(PlainStep(bound_model, cache)) or steps[-1]
    expected = completions(make_model(), tokenizer, PROMPTS[:1], max_new_tokens=12, stop_at_eos=False, strategy=strategy)
    reads = _ReadsFromTheDevice(monkeypatch)
    real_push = DecoderWindow.push

    def push_counted(window, *args, **kwargs):
        reads.counting = True
        try:
            return real_push(window, *args, **kwargs)
        finally:
            reads.counting = False

    monkeypatch.setattr(DecoderWindow, "push", push_counted)
    got = completions(model, tokenizer, PROMPTS[:1], max_new_tokens=12, stop_at_eos=False, strategy=strategy)
    assert got == expected and steps[0].tokens == got[0][:11]  # the faster step ran every token but the last
    assert reads.reads == []  # before: int(next_ids[0]), a second copy of each token
