"""`tfcli inspect-embeddings`: neighbours, analogies, PCA and the two evaluations equal a direct numpy
computation on the run's matrix and gensim's KeyedVectors on the same vectors; transformer runs (trained,
imported from transformers) and contextual vectors; bad input is one line and exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.word_vectors import require_gensim, word_shards
from tfcli.errors import TfcliError


@pytest.fixture(scope="module")
def w2v(tmp_path_factory):
    """A word2vec run on sample_data's stories (two epochs: enough for vectors with structure)."""
    from tfcli.cli.app import main  # the cli fixture is function-scoped

    folder = tmp_path_factory.mktemp("w2v")
    shards = word_shards(folder)
    try:
        main(["train", "pretrain", "--objective", "word2vec", "--data", str(shards), "-o", str(folder / "run"), "--epochs", "3", "--seed", "3"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return folder / "run"


def _matrix(run):
    from safetensors.numpy import load_file

    from tfcli.tokenizer.core import TextTokenizer

    tables = load_file(str(run / "model.safetensors"))
    tokenizer = TextTokenizer.load(run / "tokenizer.json")
    words = [tokenizer.hf.id_to_token(i) for i in range(tokenizer.vocab_size)]
    keep = (tables["counts"] > 0) & ~np.isin(np.arange(len(words)), list(tokenizer.special_ids.values()))
    return tables["input_vectors"], words, keep


def _keyed_vectors(run):
    """The run's vectors (the words seen in training) as gensim KeyedVectors."""
    require_gensim()
    from gensim.models import KeyedVectors

    vectors, words, keep = _matrix(run)
    kv = KeyedVectors(vectors.shape[1])
    kv.add_vectors([w for w, k in zip(words, keep) if k], vectors[keep])
    return kv


def _json(cli, *args):
    result = cli("inspect-embeddings", *args, "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def test_neighbours_are_numpy_cosines(cli, w2v):
    vectors, words, keep = _matrix(w2v)
    found = _json(cli, w2v, "--neighbours", "bird", "seven", "-k", "8")["neighbours"]
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    for word in ("bird", "seven"):
        i = words.index(word)
        cosines = np.where(keep, unit @ unit[i], -np.inf)
        cosines[i] = -np.inf
        best = np.argsort(-cosines)[:8]
        assert [n["id"] for n in found[word]] == best.tolist()
        np.testing.assert_allclose([n["score"] for n in found[word]], cosines[best], atol=1e-5)
        assert [n["token"] for n in found[word]] == [words[j] for j in best]


@pytest.mark.parametrize("method", ["3cosadd", "3cosmul"])
def test_analogies_are_numpy_and_gensims(cli, w2v, method):
    vectors, words, keep = _matrix(w2v)
    answers = _json(cli, w2v, "--analogy", "he - boy + girl", "--method", method, "-k", "5")["analogy"]
    assert answers["query"] == "he - boy + girl"
    tokens = [a["token"] for a in answers["answers"]]
    assert not {"he", "boy", "girl"} & set(tokens)  # the query words are left out
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    he, boy, girl = (words.index(w) for w in ("he", "boy", "girl"))
    if method == "3cosadd":
        target = unit[he] - unit[boy] + unit[girl]
        scores = unit @ (target / np.linalg.norm(target))
    else:
        cos = lambda i: (unit @ unit[i] + 1) / 2  # noqa: E731
        scores = cos(he) * cos(girl) / (cos(boy) + 1e-6)
    scores = np.where(keep, scores, -np.inf)
    scores[[he, boy, girl]] = -np.inf
    assert tokens == [words[j] for j in np.argsort(-scores)[:5]]
    kv = _keyed_vectors(w2v)
    solve = kv.most_similar if method == "3cosadd" else kv.most_similar_cosmul
    assert tokens == [w for w, _ in solve(positive=["he", "girl"], negative=["boy"], topn=5)]
    np.testing.assert_allclose([a["score"] for a in answers["answers"]], [s for _, s in solve(positive=["he", "girl"], negative=["boy"], topn=5)], atol=1e-4)


def test_evaluations_are_gensims(cli, w2v, tmp_path):
    from tfcli.inspect.embedding_report import shipped_file

    kv = _keyed_vectors(w2v)
    questions = tmp_path / "questions.txt"
    questions.write_text(shipped_file("stories", 0).read_text() + ": unseen\nboy girl xylophone zebra\n", encoding="utf-8")
    report = _json(cli, w2v, "--eval-analogies", questions, "--eval-similarity", "stories")
    theirs_total, theirs = kv.evaluate_word_analogies(str(questions))
    sections = {s["section"]: s for s in report["analogy_accuracy"]}
    for section in theirs:
        name = "total" if section["section"] == "Total accuracy" else section["section"]
        assert sections[name]["correct"] == len(section["correct"]), name
        assert sections[name]["total"] == len(section["correct"]) + len(section["incorrect"]), name
    assert sections["total"]["accuracy"] == pytest.approx(theirs_total)
    assert sections["unseen"] == {"section": "unseen", "correct": 0, "total": 0, "skipped": 1, "accuracy": None}
    pearson, spearman, oov = kv.evaluate_word_pairs(str(shipped_file("stories", 1)))
    assert report["similarity"]["rho"] == pytest.approx(spearman.statistic, abs=1e-6)
    assert report["similarity"]["skipped"] == 0 and oov == 0


def test_map_is_numpys_pca(cli, w2v, tmp_path):
    vectors, words, _ = _matrix(w2v)
    chosen = ["red", "blue", "green", "cat", "dog", "one", "two", "mom"]
    found = _json(cli, w2v, "--map", *chosen)["map"]
    x = vectors[[words.index(w) for w in chosen]]
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    centred = x - x.mean(0)
    u, s, vt = np.linalg.svd(centred, full_matrices=False)
    expected = centred @ vt[:2].T
    got = np.array([[p["x"], p["y"]] for p in found["points"]])
    signs = np.sign((got * expected).sum(0))  # each axis up to its sign
    np.testing.assert_allclose(got, expected * signs, atol=1e-4)
    np.testing.assert_allclose(found["explained_variance"], (s[:2] ** 2) / (s**2).sum(), atol=1e-5)

    png, page = tmp_path / "map.png", tmp_path / "map.html"
    assert cli("inspect-embeddings", w2v, "--map", "--top", 40, "-o", png).code == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert cli("inspect-embeddings", w2v, "--map", *chosen, "-o", page).code == 0
    text = page.read_text()
    assert "<script" not in text and all(f"<title>{w} (" in text for w in chosen)
    shown = cli("inspect-embeddings", w2v, "--map", *chosen)
    assert shown.code == 0 and all(w in shown.stdout for w in ("red", "dog", "mom"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--neighbours", "xylophone"], "'xylophone' is not in the vocabulary"),
        (["--analogy", "paris - - italy"], "expected a word after '-'"),
        (["--analogy", "paris france"], "expected + or - between 'paris' and 'france'"),
        (["--analogy", "paris -"], "ends with '-'"),
        (["--map", "bird"], "--map needs at least two tokens, not 1"),
        (["--map", "--top", "1"], "--map needs at least two tokens, not 1"),
        (["--neighbours"], "--neighbours needs at least one word"),
        (["--layer", "1", "--data", "missing.txt"], "does not exist"),
        (["--map", "bird", "cat", "-o", "map.gif"], "cannot tell the map's format"),
        ([], "nothing to look at"),
    ],
)
def test_bad_input_is_one_line(cli, w2v, args, message):
    result = cli("inspect-embeddings", w2v, *args)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len([line for line in result.stderr.splitlines() if line.strip()]) <= 2


def test_malformed_questions_name_the_line(cli, w2v, tmp_path):
    questions = tmp_path / "q.txt"
    questions.write_text(": gender\nboy girl he she\nboy girl his\n", encoding="utf-8")
    result = cli("inspect-embeddings", w2v, "--eval-analogies", questions)
    assert result.code == 2 and f"{questions}:3: expected four words" in result.stderr
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("cat\tdog\t8\ncat dog high\n", encoding="utf-8")
    result = cli("inspect-embeddings", w2v, "--eval-similarity", pairs)
    assert result.code == 2 and f"{pairs}:2: expected two words and a score" in result.stderr


@pytest.mark.parametrize("score", ["nan", "inf", "-Infinity"])
def test_a_score_that_is_not_a_number_names_its_line(cli, w2v, tmp_path, score):
    """NaN and infinities parse as floats; ranked, they gave "Spearman's rho 1.000". They are refused by line."""
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(f"cat\tdog\t8\nbird\tduck\t{score}\nred\tblue\t7\n", encoding="utf-8")
    result = cli("inspect-embeddings", w2v, "--eval-similarity", pairs)
    assert result.code == 2 and f"{pairs}:2: the score {score!r} is not a finite number" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len([line for line in result.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("option", ["--eval-similarity", "--eval-analogies"])
def test_a_one_line_file_of_150_mb_stops_at_the_line_cap(cli, w2v, tmp_path, option):
    """A word-test line holds a few words and a number; a longer one is refused in one line as soon as the cap
    is passed, without reading on (it was a MemoryError traceback), in memory that does not grow with the line."""
    import tracemalloc

    from tfcli.inspect.embedding_evals import MAX_LINE_BYTES, read_pairs, read_questions

    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as handle:
        handle.write(b"cat dog 8\n" if option == "--eval-similarity" else b"boy girl he she\n")
        block = b"x" * (1 << 20)
        for _ in range(150):
            handle.write(block)
    result = cli("inspect-embeddings", w2v, option, huge)
    assert result.code == 2 and f"{huge}:2: the line is longer than {MAX_LINE_BYTES:,} bytes" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len([line for line in result.stderr.splitlines() if line.strip()]) == 1

    reader = read_pairs if option == "--eval-similarity" else read_questions
    tracemalloc.start()
    try:
        with pytest.raises(TfcliError, match="the line is longer than"):
            list(reader(huge))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # a read block or two, not the line


def test_imported_gpt2_and_contextual_vectors(cli, tmp_path, trained_tokenizer):
    """An imported GPT-2's input embeddings are transformers' wte; a word of several tokens says so (refused
    with --strict); layer 0's contextual vectors are the mean of token plus position embeddings."""
    import shutil

    import torch
    import transformers

    from tfcli.tokenizer.core import TextTokenizer

    tokenizer = TextTokenizer.load(trained_tokenizer / "tokenizer.json")
    hf_config = transformers.GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    shutil.copy(trained_tokenizer / "tokenizer.json", tmp_path / "hf" / "tokenizer.json")
    shutil.copy(trained_tokenizer / "tokenizer_config.json", tmp_path / "hf" / "tokenizer_config.json")
    imported = cli("import", tmp_path / "hf", "-o", tmp_path / "run")
    assert imported.code == 0, imported.stderr
    run = tmp_path / "run"

    found = _json(cli, run, "--neighbours", "fox", "-k", "5")
    wte = model.transformer.wte.weight.detach().numpy()
    unit = wte / np.linalg.norm(wte, axis=1, keepdims=True)
    fox = tokenizer.encode(" fox")
    assert len(fox) == 1 and found["neighbours"]["fox"][0]["score"] == pytest.approx(
        float(np.sort(np.delete(unit @ unit[fox[0]], fox + list(tokenizer.special_ids.values())))[-1]), abs=1e-5
    )

    json_texts = [n["token"] for n in found["neighbours"]["fox"]]
    table = cli("inspect-embeddings", run, "--neighbours", "fox", "-k", "5")
    assert table.code == 0, table.stderr
    for text in json_texts:  # JSON keeps " x"; the table names it as every view does, "␣x"
        assert (text.startswith(" ") and "␣" + text.strip() in table.stdout) or (not text.startswith(" ") and text.strip() in table.stdout)
    assert any(text.startswith(" ") for text in json_texts)
    mapped = _json(cli, run, "--map", "fox", "ball")["map"]["points"]
    assert [p["token"] for p in mapped] == [" fox", " ball"]  # the map's JSON keeps the text, as neighbours'

    word = "hungrily"
    pieces = tokenizer.encode(" " + word)
    assert len(pieces) > 1
    several = _json(cli, run, "--neighbours", word)
    assert any(note.startswith(f"'{word}' is ") and " tokens (" in note and "; using " in note for note in several["notes"]), several["notes"]
    strict = cli("inspect-embeddings", run, "--neighbours", word, "--strict")
    assert strict.code == 2 and "is not one token: it tokenizes as" in strict.stderr

    text = "The fox was happy. The fox played with the ball all day, and the dog watched the fox."
    data = tmp_path / "text.txt"
    data.write_text(text, encoding="utf-8")
    contextual = _json(cli, run, "--layer", 0, "--data", data, "--neighbours", "fox", "-k", 3)
    ids = tokenizer.encode(text)
    embedded = (model.transformer.wte.weight[ids] + model.transformer.wpe.weight[: len(ids)]).detach().numpy()
    means = {i: embedded[[p for p, t in enumerate(ids) if t == i]].mean(0) for i in set(ids)}
    seen = [i for i in means if i not in tokenizer.special_ids.values()]
    target = means[fox[0]] / np.linalg.norm(means[fox[0]])
    cosines = {i: float(means[i] @ target / np.linalg.norm(means[i])) for i in seen if i != fox[0]}
    expected = sorted(cosines, key=cosines.get, reverse=True)[:3]
    assert [n["id"] for n in contextual["neighbours"]["fox"]] == expected
    assert "residual stream" in contextual["table"]
    tied = _json(cli, run, "--table", "output", "--neighbours", "fox")
    assert any("ties its unembedding" in note for note in tied["notes"])
