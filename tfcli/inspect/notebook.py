"""The inspect views for a notebook: plain functions returning objects that Jupyter shows inline through
`_repr_html_` (the same view the HTML files hold, with no network and no CDN; each its own element id
and its own scoped script, so several on one page keep their own state), and whose numbers stay at hand
(`.inspection`, `.lens`, `.ablation`, `.patching`, `.to_json()`, `.neuron(...)`).

Example: from tfcli import inspect; inspect.attention("runs/quickstart/model", "The cat sat on the mat")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcli.inspect.ablation import ablate as run_ablation
from tfcli.inspect.html import render_fragment
from tfcli.inspect.lens import logit_lens as read_lens
from tfcli.inspect.lens import token_text
from tfcli.inspect.neuron import capture_query_keys, neuron_view
from tfcli.inspect.patching import patch as run_patching
from tfcli.inspect.session import Inspection, InspectRequest, attention_document, html_page, inspect_attention, page_options, write_output
from tfcli.inspect.tables import ablation_html, lens_html, patching_html
from tfcli.loader import load_run


class AttentionView:
    """Every layer and head of one text (or two, compared): the model view, the head's map, the tokens
    and the neuron view, inline in a notebook; `save("a.html")` writes the same page as a file."""

    def __init__(self, inspection: Inspection) -> None:
        self.inspection = inspection

    def _repr_html_(self) -> str:
        inspection = self.inspection
        summary = inspection.summaries[0] if inspection.summaries else None
        return render_fragment(inspection.captures, inspection.titles, **page_options(inspection), summary=summary, changes=inspection.changes)

    @property
    def weights(self):
        """The first text's weights, float32 [layer, head, query_pos, key_pos]."""
        return self.inspection.first.weights

    def neuron(self, layer: int, head: int, query: int):
        """The numbers behind weights[layer, head, query]: q, each k, q∘k, q·k/√d and the softmax."""
        first = self.inspection.first
        return neuron_view(first, capture_query_keys(self.inspection.checkpoint.model, first), layer, head, query)

    def to_json(self) -> dict[str, Any]:
        return attention_document(self.inspection)

    def save(self, path: str | Path) -> Path:
        write_output(Path(path), html_page(self.inspection))
        return Path(path)


class TableView:
    """A logit lens, ablation or patching result, shown inline as the page `inspect-logits`,
    `inspect-ablate` or `inspect-patch` writes with -o FILE.html."""

    def __init__(self, result: Any, render) -> None:
        self.result = result
        self._render = render

    def _repr_html_(self) -> str:
        return self._render(self.result, fragment=True)

    def to_json(self) -> dict[str, Any]:
        return self.result.to_json()

    def save(self, path: str | Path) -> Path:
        write_output(Path(path), self._render(self.result))
        return Path(path)


def attention(run: str | Path, text: str, *, device: str = "auto", **options: Any) -> AttentionView:
    """`tfcli inspect-attention RUN --text TEXT` for a notebook; options as the command's (target,
    attention, layer, head, token, compare, compare_run, crop, neuron="1.0", query=5); layer=1 and head=-1 as
    numbers, or "all"."""
    for name in ("layer", "head"):
        if isinstance(options.get(name), int):
            options[name] = str(options[name])  # the command line's form
    return AttentionView(inspect_attention(InspectRequest(run=Path(run), text=text, device=device, **options)))


def logit_lens(run: str | Path, text: str, *, target: str | None = None, top_k: int = 5, device: str = "auto") -> TableView:
    """`tfcli inspect-logits`: what each layer already predicts at each position."""
    checkpoint = load_run(run, "inspect", device)
    view = TableView(read_lens(checkpoint, text, target=target, top_k=top_k), lens_html)
    view.to_json = lambda: view.result.to_json(lambda i: token_text(checkpoint.tokenizer, i))  # type: ignore[method-assign]
    return view


def ablate(run: str | Path, text: str, *, device: str = "auto", **options: Any) -> TableView:
    """`tfcli inspect-ablate`: the loss change when heads are knocked out (options: heads, mode,
    reference_text, position, top_k)."""
    return TableView(run_ablation(load_run(run, "inspect", device), text, **options), ablation_html)


def patch(run: str | Path, clean: str, corrupt: str, answer: str, wrong: str | None = None, *, device: str = "auto", **options: Any) -> TableView:
    """`tfcli inspect-patch`: how much of the clean answer each patched activation restores (options:
    per_head, method, verify)."""
    return TableView(run_patching(load_run(run, "inspect", device), clean, corrupt, answer, wrong, **options), patching_html)
