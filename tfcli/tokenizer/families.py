"""The five tokenizer families as Hugging Face `tokenizers` objects: an untrained tokenizer of each (normalizer,
pre-tokenizer, decoder and trainer), the char vocabulary tfcli counts itself, what each family needs after
training (Unigram's unk score, BERT's template), and the files written beside tokenizer.json
(tokenizer_config.json for transformers, BERT's vocab.txt)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfcli.tokenizer.core import WORDPIECE_PREFIX
from tfcli.tokenizer.specials import CONFIG_KEYS, ROLES, SpecialTokens
from tfcli.tokenizer.trainer_settings import TokenizerTrainingConfig

END_OF_WORD = "</w>"
METASPACE = "\u2581"


def _normalizer(config: TokenizerTrainingConfig):
    if config.model == "wordpiece":  # BERT's: control characters dropped, CJK characters spaced, then case and accents
        return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=config.accents_stripped, lowercase=config.lowercase)
    return normalizers.Lowercase() if config.lowercase else None


def build_untrained(config: TokenizerTrainingConfig) -> tuple[Tokenizer, object]:
    """An empty tokenizer of the chosen family, with its normalizer, pre-tokenizer and decoder, and its
    trainer (None for char, whose vocabulary `train_tokenizer` counts itself)."""
    specials = config.special_tokens
    assert specials is not None  # set in __post_init__
    unk = specials.get("unk")
    trainer_options: dict = {
        "vocab_size": config.vocab_size,
        "special_tokens": specials.all_tokens(),
        "show_progress": False,
    }
    if config.model in ("bpe", "wordpiece", "word"):
        trainer_options["min_frequency"] = config.min_frequency
    if config.limit_alphabet is not None:
        trainer_options["limit_alphabet"] = config.limit_alphabet
    trainer: object = None
    if config.model == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix=WORDPIECE_PREFIX))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece(prefix=WORDPIECE_PREFIX, cleanup=True)
        trainer = trainers.WordPieceTrainer(continuing_subword_prefix=WORDPIECE_PREFIX, **trainer_options)
    elif config.model == "unigram":
        # Only unk is a piece of the model (Unigram needs one); the other special tokens are added after the
        # pieces by `finish_unigram`, so the model can never spell them from text.
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
        trainer_options["special_tokens"] = [unk]
        trainer_options["vocab_size"] = config.vocab_size - (len(specials.all_tokens()) - 1)
        trainer = trainers.UnigramTrainer(unk_token=unk, **trainer_options)
    elif config.model == "char":
        tokenizer = Tokenizer(models.WordLevel({}, unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        tokenizer.decoder = decoders.Fuse()  # characters joined as they are
    elif config.model == "word":
        # classic word2vec's vocabulary: words and punctuation runs (\w+ | [^\w\s]+), rarer ones unk; decoding
        # joins the tokens with spaces (the library's default without a decoder)
        tokenizer = Tokenizer(models.WordLevel({}, unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordLevelTrainer(**trainer_options)
    elif config.pre_tokenizer == "byte-level":
        tokenizer = Tokenizer(models.BPE(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer_options["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    elif config.pre_tokenizer == "whitespace":
        # Sennrich's original BPE: a word-final marker, so decoding knows where the spaces were.
        tokenizer = Tokenizer(models.BPE(unk_token=unk, end_of_word_suffix=END_OF_WORD))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.decoder = decoders.BPEDecoder(suffix=END_OF_WORD)
        trainer_options["end_of_word_suffix"] = END_OF_WORD
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    if config.model == "bpe":
        trainer = trainers.BpeTrainer(**trainer_options)
    normalizer = _normalizer(config)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    return tokenizer, trainer


@dataclasses.dataclass(frozen=True)
class CharVocabulary:
    """The characters a char tokenizer keeps, and what it leaves to the unk token."""

    kept: list[str]  # in code-point order, as nanoGPT's shakespeare_char numbers them
    seen: int
    unknown: int
    unknown_occurrences: int


def char_vocabulary(counts: Counter[str], cap: int, min_frequency: int = 1) -> CharVocabulary:
    """The `cap` most frequent characters seen at least `min_frequency` times (a tie goes to the lower code
    point), in code-point order.

    Example: Counter("abracadabra"), cap=3 -> kept ["a", "b", "r"], seen 5, unknown 2 ("c", "d"), 2 occurrences
    """
    frequent = sorted((ch for ch, n in counts.items() if n >= min_frequency), key=lambda ch: (-counts[ch], ch))[:cap]
    kept = sorted(frequent)
    left_out = set(counts) - set(kept)
    return CharVocabulary(kept=kept, seen=len(counts), unknown=len(left_out), unknown_occurrences=sum(counts[ch] for ch in left_out))


def char_model(specials: SpecialTokens, kept: list[str]):
    """The char vocabulary as a `WordLevel` model: the special tokens first, then the characters."""
    vocab = {token: i for i, token in enumerate(specials.all_tokens())}
    for ch in kept:
        vocab[ch] = len(vocab)
    return models.WordLevel(vocab, unk_token=specials.get("unk"))


def finish_unigram(tokenizer: Tokenizer, specials: SpecialTokens) -> None:
    """Make the trained Unigram model safe for special tokens. The trainer scores every special token 0.0
    (probability 1), so the best segmentation of ordinary text spelled `<|unk|>` would be the unk piece; its
    score becomes lower than any spelling of it by known characters (each piece scores at least the lowest
    score). The other special tokens are added after the pieces, outside the model, so text never becomes them.
    """
    spec = json.loads(tokenizer.to_str())["model"]
    pieces = [(piece, score) for piece, score in spec["vocab"]]
    unk_id = spec["unk_id"]
    lowest = min((score for i, (_, score) in enumerate(pieces) if i != unk_id), default=0.0)
    pieces[unk_id] = (pieces[unk_id][0], len(pieces[unk_id][0]) * lowest - 10.0)
    tokenizer.model = models.Unigram(pieces, unk_id=unk_id, byte_fallback=False)
    unk = specials.get("unk")
    tokenizer.add_special_tokens([token for token in specials.all_tokens() if token != unk])


def bert_template(tokenizer: Tokenizer, specials: SpecialTokens):
    """BERT's post-processor: `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` when transformers adds special tokens
    (tfcli itself never asks it to: it inserts special ids itself)."""
    cls, sep = specials.get("cls"), specials.get("eos")
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )


def alphabet_size(tokenizer: Tokenizer, specials: list[str]) -> int:
    """Distinct single characters in the vocabulary (WordPiece's `a` and `##a` count once, Unigram's `▁` counts)."""
    special = set(specials)
    pieces = (token.removeprefix(WORDPIECE_PREFIX) for token in tokenizer.get_vocab(with_added_tokens=False) if token not in special)
    return len({piece for piece in pieces if len(piece) == 1})


def wordpiece_vocab_txt(tokenizer: Tokenizer) -> str:
    """BERT's vocab.txt: every token, one a line, in id order. Example: {"[PAD]": 0, "a": 1} -> "[PAD]\na\n"."""
    by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    assert [i for _, i in by_id] == list(range(len(by_id))), "a WordPiece vocabulary has no gaps"
    return "".join(token + "\n" for token, _ in by_id)


def tokenizer_config(config: TokenizerTrainingConfig) -> dict:
    """The tokenizer_config.json transformers reads: class, special tokens by role, max length; for
    WordPiece, BertTokenizerFast and its normalizer settings (transformers rebuilds the normalizer from them).

    `split_special_tokens` makes transformers, like tfcli, encode special-token text in user input as text.
    """
    specials = config.special_tokens
    assert specials is not None
    wordpiece = config.model == "wordpiece"
    data: dict = {"tokenizer_class": "BertTokenizerFast" if wordpiece else "PreTrainedTokenizerFast"}
    for role in ROLES:
        token = specials.get(role)
        if token is not None:
            data[CONFIG_KEYS[role]] = token
    if wordpiece:
        data["sep_token"] = specials.get("eos")  # BERT's separator plays tfcli's end-of-text role
        data["do_lower_case"] = config.lowercase
        data["strip_accents"] = config.accents_stripped
        data["tokenize_chinese_chars"] = True
    if specials.extra:
        data["additional_special_tokens"] = list(specials.extra)
    data["model_max_length"] = config.model_max_length
    data["split_special_tokens"] = True
    # BERT's WordPiece decoder already joins "word ." back into "word." token by token; transformers' clean-up on
    # top (tfcli's too, where the file asks: TextTokenizer.decode) would also take spaces out across tokens
    # ("let ' s" -> "let's", "a ' b" -> "a'b"), so the text would no longer be the decoder's
    data["clean_up_tokenization_spaces"] = False
    return data
