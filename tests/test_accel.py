"""tfcli.accel: the one call that attaches this machine's faster paths to a plain model, the choices it
measures (and remembers, and re-measures when its file is spoiled), and that every accelerated path gives
the plain model's numbers."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import forget_accel
from tfcli.accel import accelerate, choices, fused_loss, products, report
from tfcli.model.config import ModelConfig
from tfcli.model.loss import vocabulary_cross_entropy
from tfcli.model.transformer import DecoderInput, Loss, Transformer

HAS_ONEDNN = products._onednn_op() is not None


@pytest.fixture
def fresh_choices(monkeypatch, tmp_path):
    """An empty cache folder: no decision measured yet."""
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TFCLI_ACCEL", raising=False)
    forget_accel()
    yield tmp_path / "cache"
    forget_accel()


def forcing(backend: str):
    """A `choose` that picks `backend` for every product it can do (oneDNN-transposed: weight gradients)."""

    def choose(direction, m, n, k, with_bias=False):
        if backend == products.ONEDNN_TRANSPOSED and direction != "grad_weight":
            return products.ONEDNN
        return backend

    return choose


BACKENDS = [products.TORCH] + ([products.ONEDNN, products.ONEDNN_TRANSPOSED] if HAS_ONEDNN else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(7, 12), (3, 5, 12)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_torch_in_value_and_gradients(monkeypatch, backend, shape, with_bias):
    monkeypatch.setattr(products, "choose", forcing(backend))
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    weight = torch.randn(9, 12, requires_grad=True)
    bias = torch.randn(9, requires_grad=True) if with_bias else None
    leaves = [x, weight] + ([bias] if with_bias else [])
    upstream = torch.randn(*shape[:-1], 9)
    y = products.linear(x, weight, bias)
    grads = torch.autograd.grad(y, leaves, upstream)
    expected = F.linear(x, weight, bias)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not HAS_ONEDNN, reason="this torch build has no oneDNN")
def test_a_frozen_weight_gets_no_gradient_and_no_weight_product(monkeypatch):
    monkeypatch.setattr(products, "choose", forcing(products.ONEDNN))
    calls = []
    real = products.product
    monkeypatch.setattr(products, "product", lambda backend, *args: calls.append(backend) or real(backend, *args))
    x = torch.randn(4, 6, requires_grad=True)
    weight = torch.randn(3, 6)
    products.linear(x, weight).sum().backward()
    assert x.grad is not None and weight.grad is None
    assert calls == [products.ONEDNN, products.ONEDNN]  # forward and input gradient only


OPTIONS = [
    dict(arch="decoder"),
    dict(arch="decoder", positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, tie_embeddings=False, n_kv_heads=1),
    dict(arch="decoder", positions="sinusoidal", norm_placement="post", activation="gelu_tanh", n_classes=3),
    dict(arch="encoder", norm_placement="post", n_classes=2),
    dict(arch="encoder-decoder", positions="sinusoidal", n_kv_heads=2),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_an_accelerated_model_gives_the_plain_models_logits_and_gradients(monkeypatch, backend, options):
    monkeypatch.setattr(products, "choose", forcing(backend))
    config = ModelConfig(vocab_size=300, block_size=16, n_layers=2, n_heads=4, d_model=64, d_ff=96, **options)
    torch.manual_seed(0)
    plain = Transformer(config)
    fast = accelerate(Transformer(config))
    fast.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(3, 16, dtype=torch.bool)
    padding[0, 12:] = False
    extra = dict(decoder=DecoderInput(ids)) if config.arch == "encoder-decoder" else {}

    def run(model):
        model.zero_grad()
        out = model(ids, padding, **extra)
        loss = model(ids, padding, head=Loss(ids), **extra).loss
        total = loss + out.logits.square().mean() + (out.class_logits.sum() if out.class_logits is not None else 0)
        total.backward()
        return out, loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    expected, expected_loss, expected_grads = run(plain)
    got, got_loss, got_grads = run(fast)
    assert any(type(m) is products.Linear for m in fast.modules()) and not any(type(m) is products.Linear for m in plain.modules())
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_loss, expected_loss, atol=1e-5, rtol=1e-5)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_accelerate_keeps_parameters_and_state_dict():
    model = Transformer(ModelConfig(vocab_size=50, block_size=8, n_layers=1, n_heads=2, d_model=16))
    before = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    accelerate(model)
    assert {name: p for name, p in model.named_parameters()} == before  # the same tensors: an optimizer made before still works
    assert list(model.state_dict()) == keys and model.lm_head.weight is model.tok_emb.weight
    assert isinstance(model.vocabulary_loss, fused_loss.VocabularyLoss)


def test_turned_off_the_model_stays_plain(monkeypatch):
    monkeypatch.setenv("TFCLI_ACCEL", "0")
    model = accelerate(Transformer(ModelConfig(vocab_size=50, block_size=8, n_layers=1, n_heads=2, d_model=16)))
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    assert model.vocabulary_loss is vocabulary_cross_entropy
    assert model.fast_decode_step is None
    assert report()["accel"] == "off (TFCLI_ACCEL=0)"


def sleeper(seconds: float, value):
    def run():
        time.sleep(seconds)
        return value

    return run


def equal(a, b) -> bool:
    return a == b


def test_measure_keeps_pytorchs_own_unless_another_is_clearly_faster():
    decision = choices.measure({"torch": sleeper(0.004, 1), "fast": sleeper(0.001, 1)}, equal, budget_s=0.01)
    assert decision.choice == "fast" and decision.seconds["fast"] < decision.seconds["torch"]
    tie = choices.measure({"torch": sleeper(0.002, 1), "same": sleeper(0.002, 1)}, equal, budget_s=0.01)
    assert tie.choice == "torch"  # within the margin: noise never turns a tie into a switch


def test_measure_drops_a_candidate_that_disagrees_or_fails():
    def broken():
        raise RuntimeError("no kernel for this shape")

    decision = choices.measure({"torch": sleeper(0.003, 1), "wrong": sleeper(0.0, 2), "broken": broken}, equal, budget_s=0.01)
    assert decision.choice == "torch" and set(decision.seconds) == {"torch"}
    assert "wrong disagreed with PyTorch" in decision.note and "broken failed (RuntimeError: no kernel for this shape)" in decision.note


def test_a_decision_is_measured_once_and_kept_in_the_machines_file(fresh_choices, monkeypatch):
    choice = products.choose("forward", 300, 512, 256)
    store = choices.choices()
    (key,) = [k for k in store.decisions if k.startswith("linear forward")]
    assert key == f"linear forward t{torch.get_num_threads()} 512x512x256"  # rows rounded up to a power of two
    record = json.loads(store.path.read_text())
    assert record["decisions"][key]["choice"] == choice and record["torch"] == torch.__version__
    assert store.path.parent == fresh_choices / "kernels"
    forget_accel()  # a new process reads the file instead of measuring
    monkeypatch.setattr(choices, "measure", lambda *args, **kwargs: pytest.fail("measured again"))
    assert products.choose("forward", 400, 512, 256) == choice


def test_the_peak_matmul_rate_is_timed_once_and_kept_in_the_machines_file(fresh_choices, monkeypatch):
    from tfcli.train.flops import peak_matmul_flops

    peak = peak_matmul_flops(torch.device("cpu"), torch.float32)
    (key,) = [k for k in choices.choices().decisions if k.startswith("peak matmul")]
    assert key == f"peak matmul cpu float32 t{torch.get_num_threads()} 1024x1024x1024"
    seconds = json.loads(choices.choices().path.read_text())["decisions"][key]["seconds"]
    assert peak == pytest.approx(2 * 1024**3 / min(seconds.values())) and 1e8 < peak < 1e14
    forget_accel()  # a new process (the next training run) reads the rate instead of timing it
    monkeypatch.setattr(choices, "measure", lambda *args, **kwargs: pytest.fail("timed again"))
    assert peak_matmul_flops(torch.device("cpu"), torch.float32) == peak


def test_small_products_and_other_modes_keep_pytorchs_product(fresh_choices):
    assert products.choose("forward", 2, 16, 16) == products.TORCH  # too small to be worth timing
    assert choices.choices().decisions == {}
    w = torch.randn(64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert products.linear(torch.randn(1024, 64), w).dtype == torch.bfloat16  # autocast still applies
    assert products.linear(torch.randn(1024, 64).double(), w.double()).dtype == torch.float64
    assert choices.choices().decisions == {}


@pytest.mark.parametrize("spoiled", ["{not json", '{"version": 1}', '{"version": 1, "processor": "x", "torch": "0.1", "decisions": {}}', "[]"])
def test_a_spoiled_decisions_file_is_measured_again_with_a_note(fresh_choices, spoiled):
    path = choices.choices_path()
    path.write_text(spoiled)
    forget_accel()
    choice = products.choose("forward", 300, 512, 256)
    store = choices.choices()
    assert any("could not be used" in note and "measuring again" in note for note in store.notes), store.notes
    assert json.loads(path.read_text())["decisions"][f"linear forward t{torch.get_num_threads()} 512x512x256"]["choice"] == choice


def test_a_remembered_choice_of_a_library_that_fails_its_check_is_not_used(fresh_choices, monkeypatch):
    key = f"linear forward t{torch.get_num_threads()} 512x512x256"
    path = choices.choices_path()
    path.write_text(
        json.dumps(
            {"version": 1, "processor": "x", "torch": torch.__version__, "decisions": {key: {"choice": "onednn", "seconds": {"torch": 1.0, "onednn": 0.1}}}}
        )
    )
    forget_accel()
    real = products.product
    monkeypatch.setattr(products, "product", lambda backend, a, w, bias=None: real(backend, a, w, bias) + (backend == "onednn"))
    assert not products.available(products.ONEDNN)  # checked against PyTorch once a process, before any use
    assert products.choose("forward", 300, 512, 256) == products.TORCH
    x, w = torch.randn(300, 256), torch.randn(512, 256)
    torch.testing.assert_close(products.linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("grad, weight_trains, wanted", [(True, True, "gradients"), (True, False, "gradients, frozen weight"), (False, False, "value")])
def test_the_loss_choice_is_measured_and_either_gives_the_same_loss(fresh_choices, monkeypatch, grad, weight_trains, wanted):
    loss = fused_loss.VocabularyLoss()
    torch.manual_seed(0)
    hidden = torch.randn(40, 16, requires_grad=grad)
    weight = torch.randn(300, 16, requires_grad=weight_trains)  # frozen: LoRA's output layer, timed as it runs there
    targets = torch.randint(0, 300, (40,))
    with torch.set_grad_enabled(grad):
        chosen = loss.choice(hidden, weight, None, 0.0)
        (key,) = [key for key in choices.choices().decisions if key.startswith("loss")]
        assert key.endswith(f"64x300x16 {wanted}")
        decision = choices.choices().decisions[key]
        assert decision.choice == chosen and set(decision.seconds) == {"fused", "plain"}
        values = {}
        for forced in ("fused", "plain"):
            monkeypatch.setattr(fused_loss.VocabularyLoss, "choice", lambda self, *args, forced=forced: forced)
            values[forced] = loss(hidden, weight, None, targets)
    torch.testing.assert_close(values["fused"], values["plain"], atol=1e-4, rtol=1e-5)


def test_report_lists_the_machine_and_the_decisions(fresh_choices):
    products.choose("forward", 300, 512, 256)
    data = report()
    assert data["processor"] and data["torch"] == torch.__version__ and data["accel"] == "on"
    assert data["decisions_file"] == str(choices.choices_path())
    assert any(key.startswith("linear forward") for key in data["decisions"])


def test_info_device_shows_the_machine_and_its_choices(cli, fresh_choices, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the choices file's path stays whole, however deep the temporary folder
    products.choose("forward", 300, 512, 256)
    shown = cli("info", "--device")
    assert shown.code == 0, shown.stderr
    assert "processor" in shown.stdout and "linear forward" in shown.stdout and str(choices.choices_path()) in shown.stdout.replace("\n", "")
    data = json.loads(cli("info", "--device", "--json").stdout)
    assert data["accel"] == "on" and any(key.startswith("linear forward") for key in data["decisions"])
    both = cli("info", "--device", str(fresh_choices))
    assert both.code == 2 and "--device describes this machine, not a run" in both.stderr
    neither = cli("info")
    assert neither.code == 2 and "tfcli info --device" in neither.stderr
