"""`tfcli inspect-features`: what an SAE's features respond to, read through the run's hook point.

- one feature (`feature_report`): its top-activating contexts (each token with its activation; the terminal marks
  the token of each line's activation as ⟦token⟧), a histogram (10 bins) of
  its nonzero activations, its density (the share of tokens it fires on) and its logit effects (the tokens
  its decoder direction promotes and suppresses through the unembedding, where the hook is in the residual
  stream: resid_pre/mid/post, attn_out, mlp_out);
- the most active features on some data (`top_features`), and which features fire on each token of a text
  (`text_features`).

Each result is plain numbers and token texts (`to_json`); terminal, HTML and notebook renderers are below,
with the views' palette (viridis, square-root scale) and page rules (tfcli.inspect.tables). The model runs
plain (hooks on, so never the C decoding step); nothing here changes the model."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table
from rich.text import Text

from tfcli.corpus.reader import binary_file_error, looks_binary
from tfcli.data.shards import load_shard_meta, open_shard
from tfcli.errors import TfcliError
from tfcli.inspect import palette
from tfcli.inspect.session import write_output
from tfcli.inspect.tables import html_page, html_table, legend_html
from tfcli.limits import PROMPT_FILE, read_file_capped, within_context
from tfcli.loader import load_run
from tfcli.sae.files import load_sae_for
from tfcli.sae.points import activations, resolve_hook
from tfcli.tokenizer.show import token_label, views_of_ids, visible

RESIDUAL = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out", "hook_embed")
BEFORE, AFTER = 10, 3  # tokens of context shown before and after a top activation
TEXT_LIMIT = PROMPT_FILE  # the most of a text file --data reads (64 MB; TFCLI_MAX_PROMPT_FILE_BYTES)
MOST_TOKENS = 1 << 20  # --windows x --context: the most tokens one view reads (the ids and one feature's values: 12 bytes each)
FORWARD_TOKENS = 4096  # tokens read through the model and the SAE at a time (their features: FORWARD_TOKENS x d_sae floats)


@dataclasses.dataclass
class Context:
    """A window of tokens around one activation: each token's text and the feature's activation on it."""

    tokens: list[str]
    values: list[float]
    at: int  # the index in `tokens` of the activation this context is for
    value: float


@dataclasses.dataclass
class FeatureReport:
    run: str
    sae: str
    hook: str
    feature: int
    d_sae: int
    tokens_read: int
    density: float  # the share of tokens it fires on
    max_value: float
    contexts: list[Context]
    histogram: list[tuple[float, float, int]]  # (from, to, count) of its nonzero activations
    promotes: list[tuple[str, float]]  # the tokens its decoder direction raises most, through the unembedding
    suppresses: list[tuple[str, float]]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TopFeatures:
    run: str
    sae: str
    hook: str
    tokens_read: int
    rows: list[dict[str, Any]]  # feature, density, mean (when active), max, top token

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TextFeatures:
    run: str
    sae: str
    hook: str
    text: str
    tokens: list[str]
    features: list[list[tuple[int, float]]]  # per token: (feature, activation), strongest first
    labels: list[str]  # each token as every view labels it (" cat" -> "␣cat", "\n" -> "↵")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class FeatureSession:
    """A run and an SAE checked against it, ready to read features."""

    def __init__(self, run: Path | str, sae: Path | str, device: str = "cpu") -> None:
        self.run, self.sae_path = Path(run), Path(sae)
        self.checkpoint = load_run(self.run, "inspect", device)
        self.model, self.tokenizer = self.checkpoint.model, self.checkpoint.tokenizer
        if self.checkpoint.config.model.arch != "decoder":
            raise TfcliError(f"inspect-features works on decoder runs; {run} is {self.checkpoint.config.model.arch}")
        self.sae, self.config = load_sae_for(self.sae_path, self.model, run)
        self.hook = resolve_hook(self.model, self.config.hook_name)

    def check_feature(self, feature: int) -> None:
        if not 0 <= feature < self.config.d_sae:
            raise TfcliError(f"--feature {feature} is out of range: the SAE has {self.config.d_sae} features", hint=f"pick 0 to {self.config.d_sae - 1}")

    def windows(self, data: Path, windows: int, context: int, seed: int = 0) -> torch.Tensor:
        """(N, T) token ids: N windows that never overlap, drawn (by `seed`) from a shard folder's val split (train
        if empty) or a text file (at most 64 MB of it); fewer than `windows` where the data holds fewer, so no
        token is counted twice. At most MOST_TOKENS tokens in all."""
        data = Path(data)
        if windows * context > MOST_TOKENS:
            raise TfcliError(
                f"--windows {windows:,} x --context {context:,} is {windows * context:,} tokens, more than the {MOST_TOKENS:,} inspect-features reads",
                hint="pass fewer --windows",
            )
        if data.is_dir() and (data / "meta.json").is_file():
            if load_shard_meta(data).tokenizer_sha256 != self.tokenizer.sha256:
                raise TfcliError(
                    f"the shards in {data} were encoded with another tokenizer than {self.run}'s", hint="encode the text with the run's tokenizer.json"
                )
            tokens = open_shard(data, "val")
            tokens = tokens if len(tokens) else open_shard(data, "train")
        elif data.is_file():
            try:
                raw = read_file_capped(data, TEXT_LIMIT)
            except OSError as exc:
                raise TfcliError(f"cannot read {data}: {exc}") from exc
            if looks_binary(raw):
                raise binary_file_error(data)
            tokens = np.asarray(self.tokenizer.encode(raw.decode("utf-8", errors="replace")), dtype=np.int64)
        else:
            raise TfcliError(f"{data} does not exist", hint="pass a shard folder or a text file as --data")
        context = min(context, self.checkpoint.config.model.block_size, len(tokens))
        if context < 1:
            raise TfcliError(f"{data} holds no tokens", hint="pass more text")
        slots = len(tokens) // context  # the windows the data holds side by side
        chosen = np.sort(np.random.default_rng(seed).choice(slots, size=min(windows, slots), replace=False))
        return torch.from_numpy(np.stack([np.asarray(tokens[i * context : (i + 1) * context], dtype=np.int64) for i in chosen]))

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, T) ids -> (N, T, d_sae) feature activations."""
        with torch.no_grad():
            return self.sae.encode(activations(self.model, self.hook, ids.to(next(self.model.parameters()).device))).cpu()

    def features_in_batches(self, ids: torch.Tensor) -> Iterator[torch.Tensor]:
        """(N, T) ids -> (n, T, d_sae) feature activations for a few windows at a time (FORWARD_TOKENS tokens), so
        memory holds one batch's features, not every window's."""
        rows = max(1, FORWARD_TOKENS // ids.shape[1])
        for start in range(0, len(ids), rows):
            yield self.features(ids[start : start + rows])

    def logit_effects(self, feature: int, top: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]], str]:
        if not self.hook.endswith(RESIDUAL):
            return [], [], f"no logit effects: {self.hook} is not in the residual stream"
        with torch.no_grad():
            direction = self.sae.W_dec[feature]
            logits = (direction @ self.model.lm_head.weight.T).cpu()  # (vocab,): the direction read by the unembedding
        up, down = logits.topk(top), (-logits).topk(top)
        label = lambda i: token_label(self.tokenizer, int(i))  # noqa: E731
        return [(label(i), float(v)) for v, i in zip(*up)], [(label(i), float(-v)) for v, i in zip(*down)], ""


def feature_report(session: FeatureSession, data: Path, feature: int, *, top: int = 10, windows: int = 64, context: int = 128) -> FeatureReport:
    session.check_feature(feature)
    ids = session.windows(data, windows, context)
    values = torch.cat([acts[..., feature] for acts in session.features_in_batches(ids)])  # (N, T)
    flat = values.flatten()
    order = flat.argsort(descending=True)[:top]
    contexts = []
    for index in order.tolist():
        if flat[index] <= 0:
            break
        row, pos = divmod(index, ids.shape[1])
        lo, hi = max(0, pos - BEFORE), min(ids.shape[1], pos + AFTER + 1)
        texts = [v.text for v in views_of_ids(session.tokenizer, ids[row, lo:hi].tolist())]
        contexts.append(Context(texts, [round(float(v), 4) for v in values[row, lo:hi]], pos - lo, float(flat[index])))
    active = flat[flat > 0].numpy()
    histogram = []
    if len(active):
        counts, edges = np.histogram(active, bins=min(10, max(1, len(active))))
        histogram = [(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)]
    promotes, suppresses, note = session.logit_effects(feature, top)
    return FeatureReport(
        str(session.run), str(session.sae_path), session.hook, feature, session.config.d_sae, int(flat.numel()),
        float((flat > 0).double().mean()), float(flat.max()), contexts, histogram, promotes, suppresses, note,
    )  # fmt: skip


def top_features(session: FeatureSession, data: Path, *, top: int = 20, windows: int = 64, context: int = 128) -> TopFeatures:
    ids = session.windows(data, windows, context)
    d_sae = session.config.d_sae
    fired, total = torch.zeros(d_sae, dtype=torch.long), torch.zeros(d_sae, dtype=torch.float64)
    peak, peak_at = torch.zeros(d_sae), torch.zeros(d_sae, dtype=torch.long)  # each feature's largest activation, and where
    read = 0
    for acts in session.features_in_batches(ids):
        acts = acts.flatten(0, 1)  # (n * T, d_sae)
        fired += (acts > 0).sum(0)
        total += acts.sum(0, dtype=torch.float64)
        values, where = acts.max(0)
        higher = values > peak
        peak, peak_at = torch.where(higher, values, peak), torch.where(higher, where + read, peak_at)
        read += len(acts)
    chosen = total.argsort(descending=True)[:top]
    flat_ids = ids.flatten()
    rows = []
    for f in chosen.tolist():
        if fired[f] == 0:
            break
        rows.append(
            {
                "feature": f,
                "density": float(fired[f] / read),
                "mean_when_active": float(total[f] / fired[f]),
                "max": float(peak[f]),
                "top_token": token_label(session.tokenizer, int(flat_ids[peak_at[f]])),
            }
        )
    return TopFeatures(str(session.run), str(session.sae_path), session.hook, read, rows)


def text_features(session: FeatureSession, text: str, *, top: int = 5) -> TextFeatures:
    block = session.checkpoint.config.model.block_size
    ids = session.tokenizer.encode(within_context(text, block, "text", hint="pass a shorter text"))
    if not ids:
        raise TfcliError("--text is empty", hint="pass some text")
    if len(ids) > block:
        raise TfcliError(f"the text is {len(ids)} tokens, longer than the model's block size ({block})", hint="pass a shorter text")
    acts = session.features(torch.tensor([ids]))[0]  # (T, d_sae)
    values, indices = acts.topk(min(top, acts.shape[1]), dim=-1)
    per_token = [[(int(i), round(float(v), 4)) for v, i in zip(vs, js) if v > 0] for vs, js in zip(values, indices)]
    views = views_of_ids(session.tokenizer, ids)
    return TextFeatures(str(session.run), str(session.sae_path), session.hook, text, [v.text for v in views], per_token, [v.label for v in views])


# ---- terminal -------------------------------------------------------------------------------------


def _shade(value: float, peak: float) -> str:
    weight = value / peak if peak > 0 else 0.0
    return f"{'white' if palette.dark(weight) else 'black'} on {palette.css(weight)}"


def report_renderables(report: FeatureReport) -> list[Any]:
    """The report for a rich console: a line of numbers, the top contexts with each token shaded by the
    feature's activation (viridis, square-root scale, relative to its largest), the histogram, the logit effects."""
    out: list[Any] = [
        Text(
            f"feature {report.feature} of {report.d_sae} at {report.hook}: fires on {report.density:.2%} of {report.tokens_read:,} tokens, "
            f"at most {report.max_value:.3g}"
        )
    ]
    if not report.contexts:
        out.append(Text("it never fired on these tokens"))
    for c in report.contexts:
        line = Text(f"{c.value:8.3f}  ")
        for i, (token, value) in enumerate(zip(c.tokens, c.values)):
            shown = f"⟦{token}⟧" if i == c.at else token  # the activation this line is for, also where colour is off
            line.append(shown, style=_shade(value, report.max_value) + (" underline" if i == c.at else ""))
        out.append(line)
    if report.histogram:
        biggest = max(count for _, _, count in report.histogram)
        out.append(Text("activations when active:"))
        for lo, hi, count in report.histogram:
            out.append(Text(f"  {lo:7.3f} – {hi:7.3f} {'█' * max(1 if count else 0, round(30 * count / biggest))} {count}"))
    if report.note:
        out.append(Text(report.note))
    elif report.promotes:
        out.append(Text("promotes:   " + "  ".join(f"{t} {v:+.2f}" for t, v in report.promotes)))
        out.append(Text("suppresses: " + "  ".join(f"{t} {v:+.2f}" for t, v in report.suppresses)))
    return out


def top_table(result: TopFeatures) -> Table:
    table = Table(title=f"the most active features at {result.hook} ({result.tokens_read:,} tokens)")
    for name in ("feature", "density", "mean when active", "max", "strongest on"):
        table.add_column(name, justify="right" if name != "strongest on" else "left")
    for r in result.rows:
        table.add_row(str(r["feature"]), f"{r['density']:.2%}", f"{r['mean_when_active']:.3f}", f"{r['max']:.3f}", Text(r["top_token"]))
    return table


def text_table(result: TextFeatures) -> Table:
    table = Table(title=f"features firing on each token at {result.hook}, strongest first")
    table.add_column("token")
    table.add_column("features (activation)")
    for label, features in zip(result.labels, result.features):
        table.add_row(Text(label), "  ".join(f"{f} ({v:.2f})" for f, v in features) or "none")
    return table


# ---- HTML (the page rules and palette of tfcli.inspect.tables) ------------------------------------


def _cell(text: str, value: float, peak: float, tip: str) -> tuple[str, str, bool, str]:
    weight = value / peak if peak > 0 else 0.0
    return (text, palette.css(weight), palette.dark(weight), tip)


def report_html(report: FeatureReport, *, fragment: bool = False) -> str:
    tables = []
    if report.contexts:
        width = max(len(c.tokens) for c in report.contexts)
        cells = [
            [_cell(t, v, report.max_value, f"{v:.4g}") for t, v in zip(c.tokens, c.values)] + [("", "#fff", False, "")] * (width - len(c.tokens))
            for c in report.contexts
        ]
        rows = [f"{c.value:.3f}" for c in report.contexts]
        tables.append(html_table("top-activating contexts (each token shaded by the feature's activation)", rows, [""] * width, cells))
    if report.histogram:
        biggest = max(count for _, _, count in report.histogram)
        rows = [f"{lo:.3f} – {hi:.3f}" for lo, hi, _ in report.histogram]
        cells = [[_cell(str(count), count, biggest, f"{count} tokens")] for _, _, count in report.histogram]
        tables.append(html_table("activations when active (tokens per bin)", rows, ["tokens"], cells))
    if report.promotes:
        peak = max(abs(v) for _, v in report.promotes + report.suppresses)
        cells = [[_cell(t, abs(v), peak, f"{v:+.4g}"), _cell(s, abs(w), peak, f"{w:+.4g}")] for (t, v), (s, w) in zip(report.promotes, report.suppresses)]
        tables.append(
            html_table(
                "logit effects: the tokens its decoder direction promotes and suppresses",
                [str(i + 1) for i in range(len(cells))],
                ["promotes", "suppresses"],
                cells,
            )
        )
    notes = [f"run: {report.run}", f"SAE: {report.sae}", f"fires on {report.density:.2%} of {report.tokens_read:,} tokens; at most {report.max_value:.4g}"]
    notes += [report.note] if report.note else []
    title = f"feature {report.feature} of {report.d_sae} · {report.hook}"
    return html_page(title, notes, tables, legend=legend_html("activation / its largest"), fragment=fragment)


def top_html(result: TopFeatures, *, fragment: bool = False) -> str:
    peak = max((r["density"] for r in result.rows), default=1.0)
    cells = [
        [_cell(f"{r['density']:.2%}", r["density"], peak, ""), _cell(f"{r['max']:.3f}", 0, 1, ""), _cell(visible(r["top_token"]), 0, 1, "")]
        for r in result.rows
    ]
    table = html_table("the most active features", [str(r["feature"]) for r in result.rows], ["density", "max", "strongest on"], cells)
    return html_page(f"features · {result.hook}", [f"run: {result.run}", f"SAE: {result.sae}", f"{result.tokens_read:,} tokens"], [table], fragment=fragment)


def text_html(result: TextFeatures, *, fragment: bool = False) -> str:
    peak = max((v for fs in result.features for _, v in fs), default=1.0)
    width = max((len(fs) for fs in result.features), default=1) or 1
    cells = [[_cell(f"{f}", v, peak, f"{v:.4g}") for f, v in fs] + [("", "#fff", False, "")] * (width - len(fs)) for fs in result.features]
    table = html_table(
        "features firing on each token, strongest first (hover: the activation)",
        result.labels,
        [f"#{i + 1}" for i in range(width)],
        cells,
    )
    return html_page(
        f"features · {result.hook}",
        [f"run: {result.run}", f"SAE: {result.sae}", f"text: {result.text}"],
        [table],
        legend=legend_html("activation / the largest"),
        fragment=fragment,
    )


# ---- the notebook ---------------------------------------------------------------------------------


class FeaturesView:
    """A features result shown inline in a notebook (the page -o FILE.html writes); `.result` holds the
    numbers, `to_json()` them as --json prints them, `save("f.html")` writes the page."""

    def __init__(self, result: FeatureReport | TopFeatures | TextFeatures) -> None:
        self.result = result
        self._render = {FeatureReport: report_html, TopFeatures: top_html, TextFeatures: text_html}[type(result)]

    def _repr_html_(self) -> str:
        return self._render(self.result, fragment=True)

    def to_json(self) -> dict[str, Any]:
        return self.result.to_json()

    def save(self, path: str | Path) -> Path:
        write_output(Path(path), self._render(self.result))
        return Path(path)


def features(
    run: str | Path,
    sae: str | Path,
    *,
    feature: int | None = None,
    text: str | None = None,
    data: str | Path | None = None,
    top: int = 10,
    windows: int = 64,
    context: int = 128,
    device: str = "cpu",
) -> FeaturesView:
    """`tfcli inspect-features` for a notebook: `text=` the features on each token, else `data=` with
    `feature=` one feature's report, or without it the `top` most active features."""
    if top < 1 or windows < 1 or context < 1:
        raise TfcliError("top, windows and context must be at least 1")
    session = FeatureSession(run, sae, device)
    if text is not None:
        return FeaturesView(text_features(session, text, top=min(top, 10)))
    if data is None:
        raise TfcliError("pass data= (for feature= or the top features) or text=")
    if feature is not None:
        return FeaturesView(feature_report(session, Path(data), feature, top=top, windows=windows, context=context))
    return FeaturesView(top_features(session, Path(data), top=top, windows=windows, context=context))
