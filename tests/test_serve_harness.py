"""lm-evaluation-harness's `local-completions` model pointed at `tfcli serve`: a multiple-choice task (a JSONL
file and its YAML, written here) runs through the server's `echo` + `logprobs`, and every choice's
log-likelihood equals tfcli's own scorer on the same ids within 1e-4."""

from __future__ import annotations

import json

import pytest

from tests.serving import make_chat_run, running_server

lm_eval = pytest.importorskip("lm_eval")

DOCS = [
    ("What did the fox find?", ["a red ball", "the rain", "a park"], 0),
    ("What did the dog not like?", ["a red ball", "the rain", "three apples"], 1),
    ("Who was hungry?", ["Mia", "Tom", "the cat"], 0),
    ("What did the cat like to watch?", ["the ball", "the rain fall", "the café"], 1),
]

TASK = """task: tfcli_serve_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
"""


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair: trailing spaces of the context move to the continuation; the
    continuation's ids are what encoding both adds to the context's."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, head = tokenizer.encode(context + continuation), tokenizer.encode(context)
    return head, whole[len(head) :]


def test_lm_eval_local_completions_scores_each_choice_as_tfcli_does(tmp_path_factory, trained_tokenizer, tmp_path):
    from lm_eval.tasks import TaskManager

    from tfcli.checkpoint import load_checkpoint
    from tfcli.generate.scoring import score_continuations
    from tfcli.harness.tasks import go_offline

    run = make_chat_run(tmp_path_factory, trained_tokenizer)
    data = tmp_path / "choice.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "label": a}) + "\n" for q, c, a in DOCS), encoding="utf-8")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "choice.yaml").write_text(TASK.format(data=data), encoding="utf-8")
    go_offline()
    with running_server(run) as server:  # lm-eval asks for prompt ids with echo, max_tokens 1, logprobs 1
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"base_url={server.v1}/completions,model=chat,tokenizer_backend=huggingface,tokenizer={run},max_length=96,num_concurrent=1,max_retries=1",
            tasks=["tfcli_serve_choice"],
            task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
            log_samples=True,
        )
    samples = results["samples"]["tfcli_serve_choice"]
    assert len(samples) == len(DOCS)
    checkpoint = load_checkpoint(run)
    pairs, served = [], []
    for sample in samples:
        doc = sample["doc"]
        for choice, response in zip(doc["choices"], sample["filtered_resps"]):
            pairs.append(encode_pair(checkpoint.tokenizer, doc["question"], " " + choice))
            served.append(float(response[0]))
    ours = [s.logprob for s in score_continuations(checkpoint.model, pairs)]
    assert len(served) == 12 and all(lp < 0 for lp in served)
    assert served == pytest.approx(ours, abs=1e-4)
    assert 0.0 <= results["results"]["tfcli_serve_choice"]["acc,none"] <= 1.0
