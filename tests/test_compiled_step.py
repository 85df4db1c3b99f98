"""Compiled decoding (tfcli.accel.compiled_step): torch.compile over the decoding step on the static KV cache,
for one row (generate's window) and for serve's continuous batch (rows of different lengths joining and
leaving), gives the plain step's logits and greedy ids; `tune` and `tune_rows` time it beside the other steps
and record the choice with its compile time; `bind` and `bind_rows` hand out the compiled step only where that
stored decision chose it; nothing waits for the compiler; on a GPU it compiles for CUDA graphs.

One real torch.compile (inductor) runs here, of the batch step of a one-layer model, shared by the module's
tests (its graph is cached for the process): cold it costs about 5 s of CPU, once inductor is spared its
check of the CPU's vector extensions (six small C++ programs built and run, about 9 s of CPU; the step
compiled without vectorization computes the same values). The one-row step is traced by TorchDynamo whole
(`fullgraph`, the same capture inductor compiles) and run eagerly. The tests marked `cuda` run the compiled
steps on a GPU with mode="reduce-overhead" (CUDA graphs), and skip without one (scripts/gpu_check.sh runs them)."""

from __future__ import annotations

import functools
import json
import threading
import types

import pytest
import torch
import torch._inductor.config as inductor_config

from tests.test_serve_slots import VOCAB, decode_joining_and_leaving
from tfcli.accel import choices, compiled_step, decode_step
from tfcli.generate.decoding import Generator
from tfcli.generate.events import Done
from tfcli.generate.settings import GenerationSettings
from tfcli.model.attention import KVCache
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer
from tfcli.serve.slots import SlotBatch
from tfcli.tokenizer.core import TextTokenizer

CONFIG = ModelConfig(
    vocab_size=320, block_size=48, n_layers=1, n_heads=4, n_kv_heads=2, d_model=32, d_ff=64, positions="rotary", norm="rmsnorm", activation="swiglu", bias=False
)
# serve's batch: the smallest model that still has grouped-query heads and rotary positions (each row its own)
BATCH_CONFIG = ModelConfig(
    vocab_size=50, block_size=24, n_layers=1, n_heads=2, n_kv_heads=1, d_model=16, d_ff=32, positions="rotary", norm="rmsnorm", activation="swiglu", bias=False
)
ROWS = 3
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh runs these where one is lent)")


def random_model(config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    built = Transformer(config).eval()
    with torch.no_grad():
        for parameter in built.parameters():
            parameter.normal_(0.0, 0.2)
    return built


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_model(CONFIG)


@pytest.fixture(scope="module")
def batch_model() -> Transformer:
    return random_model(BATCH_CONFIG)


@pytest.fixture(scope="module")
def inductor_without_isa_probes():
    """Inductor as it compiles for real, without its probe of the CPU's vector extensions (see above)."""
    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        yield


@pytest.fixture(scope="module")
def traced():
    """The step traced whole by TorchDynamo (fullgraph: a graph break fails) and run eagerly: what inductor
    compiles, without compiling it."""
    return torch.compile(compiled_step._step, backend="eager", fullgraph=True)


@pytest.fixture
def private_choices(monkeypatch, tmp_path) -> choices.Choices:
    """Decisions in a file of this test's own, never the suite's shared one (where a compiled choice would
    reach other tests' models of the same shape)."""
    store = choices.Choices(tmp_path / "choices.json", torch.__version__)
    monkeypatch.setattr(choices, "_choices", store)
    return store


def greedy_ids(model, tokenizer, fast_step) -> list[int]:
    model.fast_decode_step = fast_step
    try:
        events = list(Generator(model, tokenizer, GenerationSettings(max_new_tokens=16, stop_at_eos=False), batch_size=1).run(["Once upon a time"]))
    finally:
        model.fast_decode_step = None
    assert isinstance(events[-1], Done)
    return events[-1].completions[0].tokens


@torch.inference_mode()
def test_the_compiled_batch_step_decodes_rows_joining_and_leaving_as_the_plain_step(batch_model, inductor_without_isa_probes, monkeypatch):
    """The one real compile: serve's batch with the compiled step (bound as serve binds it, compiled in its
    thread) against the plain batch, step by step: logits within 1e-5 and the same greedy tokens, while
    rows of different lengths join, shift right, leave and the window drops its empty columns."""
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    plain, fast = SlotBatch(batch_model, ROWS, VOCAB), SlotBatch(batch_model, ROWS, VOCAB)
    assert plain.fast_step is None and fast.compiled_state() == "off"  # no tfcli.accel attached: nothing bound
    fast.fast_step = compiled_step.bind_rows(batch_model, fast.cache, fast.real, force=True)
    assert fast.compiled_state() in ("compiling", "ready")
    assert fast.fast_step.ready.wait(timeout=600) and fast.fast_step.problem is None, fast.fast_step.problem
    assert fast.compiled_state() == "ready"
    calls = []
    original = compiled_step.CompiledBatchStep.__call__
    monkeypatch.setattr(compiled_step.CompiledBatchStep, "__call__", lambda self, *a: (calls.append(a[0].shape[0]), original(self, *a))[1])
    decode_joining_and_leaving([plain, fast], tolerance=1e-5)
    assert len(calls) > 20 and min(calls) == 1 and max(calls) == ROWS  # every step went through it, with 1 to 3 rows in use
    assert compiled_step.compile_seconds[compiled_step.rows_key(batch_model, ROWS)] > 0


def test_tune_rows_times_the_batch_step_and_serve_binds_it_only_where_it_was_chosen(batch_model, inductor_without_isa_probes, private_choices):
    with torch.inference_mode():
        decision = compiled_step.tune_rows(batch_model, ROWS)
    assert set(decision.seconds) == {decode_step.TORCH, compiled_step.COMPILED} and decision.compile_seconds > 0 and decision.note == ""
    key = compiled_step.rows_key(batch_model, ROWS)
    assert key.startswith("compiled-rows3 cpu float32 ") and choices.ChoicesFile.load(private_choices.path).decisions[key] == decision
    batch_model.fast_decode_step = compiled_step.bind  # as tfcli.accel attaches it; serve makes its batch outside inference mode
    try:
        private_choices.decisions[key] = choices.Decision(compiled_step.COMPILED, decision.seconds, compile_seconds=1.0)
        assert isinstance(SlotBatch(batch_model, ROWS, VOCAB).fast_step, compiled_step.CompiledBatchStep)
        assert SlotBatch(batch_model, ROWS + 1, VOCAB).fast_step is None  # another row count: another shape, not measured
        private_choices.decisions[key] = choices.Decision(decode_step.TORCH, decision.seconds)
        assert SlotBatch(batch_model, ROWS, VOCAB).fast_step is None
    finally:
        batch_model.fast_decode_step = None
    batch_model.train()
    try:
        assert "training" in compiled_step.unsupported_rows(batch_model, KVCache(BATCH_CONFIG, ROWS, 8, torch.float32))
    finally:
        batch_model.eval()


@torch.inference_mode()
def test_the_compiled_step_gives_the_plain_steps_logits_and_greedy_ids(model, traced, trained_tokenizer, private_choices, monkeypatch):
    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: traced)
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    plain, cache = KVCache(CONFIG, 1, 24, torch.float32), KVCache(CONFIG, 1, 24, torch.float32)
    prompt = torch.tensor([[5, 17, 42]])
    model.decode(prompt, cache=plain)
    model.decode(prompt, cache=cache)
    step = compiled_step.CompiledDecoderStep(model, cache)
    assert step.ready.wait(timeout=600) and step.problem is None and step.usable()
    token = 9
    for _ in range(12):
        expected = model.unembed(model.decode(torch.tensor([[token]]), cache=plain)[:, -1])
        got = step(token)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        token = int(expected.argmax())
        assert int(got.argmax()) == token
    assert cache.length == plain.length == 15
    # through the generator: the window binds the compiled step (forced, as `bench generate` times it), uses it, same ids
    calls = []
    original = compiled_step.CompiledDecoderStep.__call__
    monkeypatch.setattr(compiled_step.CompiledDecoderStep, "__call__", lambda self, t: (calls.append(t), original(self, t))[1])
    tokenizer = TextTokenizer.load(trained_tokenizer)
    compiled = greedy_ids(model, tokenizer, functools.partial(compiled_step.bind, force=True))
    assert compiled == greedy_ids(model, tokenizer, None)
    assert len(calls) == 15  # every token after the first (the prompt's pass gives that one)
    assert compiled_step.compile_seconds[compiled_step.shape_key(model)] > 0


def test_tune_measures_the_three_steps_and_bind_follows_the_stored_decision(model, traced, private_choices, monkeypatch):
    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: traced)
    with torch.inference_mode():
        decision = compiled_step.tune(model, 16)
    assert {decode_step.TORCH, compiled_step.COMPILED} <= set(decision.seconds) and decision.compile_seconds > 0
    assert decision.choice in decision.seconds
    key = compiled_step.shape_key(model)
    on_disk = choices.ChoicesFile.load(private_choices.path).decisions[key]
    assert on_disk == decision  # recorded, compile time included
    assert compiled_step.stored() == {key: decision}  # what `tfcli info --device` lists
    with torch.inference_mode():
        cache = KVCache(CONFIG, 1, 24, torch.float32)
        private_choices.decisions[key] = choices.Decision(compiled_step.COMPILED, decision.seconds)
        assert isinstance(compiled_step.bind(model, cache), compiled_step.CompiledDecoderStep)
        private_choices.decisions[key] = choices.Decision(decode_step.TORCH, decision.seconds)
        assert not isinstance(compiled_step.bind(model, cache), compiled_step.CompiledDecoderStep)
        assert compiled_step.bind(model, KVCache(CONFIG, 2, 24, torch.float32)) is None  # two rows: PyTorch's step
        model.train()
        try:
            assert "training" in compiled_step.unsupported(model, cache)
        finally:
            model.eval()


def test_a_16_bit_model_keeps_a_compiled_step_that_rounds_otherwise(private_choices, monkeypatch):
    """A GPU decodes in bf16, where PyTorch rounds after every operation and a compiled kernel keeps fp32
    inside: logits 1% apart are the same step there (not in fp32), while logits half off are refused in both."""
    off = 1.01
    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: lambda model, *args: compiled_step._step(model, *args) * off)
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    monkeypatch.setattr(choices, "measure", functools.partial(choices.measure, budget_s=0.01))  # the comparison, not the timing
    half = random_model(CONFIG).to(torch.bfloat16)
    with torch.inference_mode():
        decision = compiled_step.tune(half, 16)
    assert compiled_step.COMPILED in decision.seconds and "disagreed" not in decision.note, decision.note
    expected = torch.linspace(-4, 4, 320)[None]
    assert compiled_step.same_logits(torch.bfloat16)(expected, expected * off) and not compiled_step.same_logits(torch.float32)(expected, expected * off)
    assert not compiled_step.same_logits(torch.bfloat16)(expected, expected * 1.5)


def test_a_window_decodes_with_pytorchs_step_while_the_compiler_works(model, trained_tokenizer, private_choices, monkeypatch):
    """The compiled function is held back (a compile that has not finished): the generator still decodes
    every token, with the plain step over the same cache, and the same ids; nothing compiles here."""
    release = threading.Event()
    ran = []

    def slow_compile(*args):
        release.wait(timeout=60)
        ran.append(True)
        raise RuntimeError("never used")

    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: slow_compile)
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    tokenizer = TextTokenizer.load(trained_tokenizer)
    steps = []
    bind = functools.partial(compiled_step.bind, force=True)
    made = greedy_ids(model, tokenizer, lambda m, c: steps.append(bind(m, c)) or steps[-1])
    assert made == greedy_ids(model, tokenizer, None)
    assert len(steps) == 1 and not steps[0].usable() and not ran  # the compiled step was bound, never ready, never called
    release.set()


def test_on_a_gpu_the_step_compiles_for_cuda_graphs_over_fixed_buffers(monkeypatch):
    """What can be checked of the GPU path without a GPU: the mode, the buffers marked static (CUDA graphs
    replay on the addresses they captured) and the output copied before the next replay reuses it."""
    assert compiled_step.mode_for(torch.device("cuda", 0)) == "reduce-overhead" and compiled_step.mode_for(torch.device("cpu")) == "default"
    made = []
    monkeypatch.setattr(torch, "compile", lambda function, **options: made.append(options) or function)
    monkeypatch.setattr(compiled_step, "_functions", {})
    assert compiled_step.compiled_function(torch.device("cuda", 0)) is compiled_step._step
    assert made == [{"mode": "reduce-overhead", "fullgraph": True}]
    static, dynamic = [], []
    monkeypatch.setattr(torch._dynamo, "mark_static_address", lambda tensor, guard=True: static.append((tensor, guard)))
    monkeypatch.setattr(torch._dynamo, "mark_dynamic", lambda tensor, dim: dynamic.append((tensor, dim)))
    buffers = tuple(torch.zeros(2, 3) for _ in range(4))
    compiled_step._CompiledStep._mark(types.SimpleNamespace(cuda=True), buffers, {2: 1, 3: 1})
    assert [id(b) for b, _ in static] == [id(b) for b in buffers] and [(id(t), d) for t, d in dynamic] == [(id(buffers[2]), 1), (id(buffers[3]), 1)]
    assert not any(guard for _, guard in static)  # unguarded (older torch guards by default): a new window re-records, never recompiles
    output = torch.ones(2)
    step = types.SimpleNamespace(cuda=True, function=lambda model, *args: output, model=None, args=(), key="k")
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    copied = compiled_step._CompiledStep._run(step)
    assert copied is not output and torch.equal(copied, output)


def test_each_thread_that_runs_the_step_on_a_gpu_gets_torchs_cuda_graph_state(monkeypatch):
    """torch keeps CUDA graph trees per thread, and before 2.12 only the thread that imported them had that
    state (any other failed with a bare AssertionError): the compile thread and serve's engine thread get it."""
    from torch._inductor import cudagraph_trees

    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    step = types.SimpleNamespace(cuda=True, function=lambda model, *args: torch.ones(2), model=None, args=(), key="k")
    seen = {}

    def engine_thread():
        seen["before"] = hasattr(cudagraph_trees.local, "tree_manager_containers")
        compiled_step._CompiledStep._run(step)  # as serve's engine thread runs the batch step
        seen["after"] = hasattr(cudagraph_trees.local, "tree_manager_containers")
        seen["container"] = cudagraph_trees.get_container(0)  # what torch looks up when it records a graph

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join(timeout=60)
    assert seen["before"] is False and seen["after"] is True and seen["container"].device_index == 0


@pytest.mark.parametrize("inference", [False, True], ids=["serve's batch, made outside inference mode", "a window's, made inside"])
def test_the_thread_compiles_the_graph_the_caller_then_runs(batch_model, monkeypatch, inference):
    """The compile thread's scratch buffers are made as the real ones are (inference tensors or not, which
    TorchDynamo compiles apart) and marked as a GPU marks them (static addresses, unguarded: a guarded one
    compiles again for every other buffer), so the caller's first step runs what the thread compiled, never a
    second compile that it would wait for."""
    from torch._dynamo.testing import CompileCounter

    mark = compiled_step._CompiledStep._mark
    monkeypatch.setattr(compiled_step._CompiledStep, "_mark", lambda self, buffers, dims: mark(types.SimpleNamespace(cuda=True), buffers, dims))
    counter = CompileCounter()
    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: torch.compile(compiled_step._step, backend=counter, fullgraph=True))
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    with torch.inference_mode(inference):
        cache = KVCache(BATCH_CONFIG, ROWS, 12, torch.float32)
        real = torch.zeros(ROWS, 12, dtype=torch.bool)
        step = compiled_step.CompiledBatchStep(batch_model, cache, real)
    assert step.ready.wait(timeout=600) and step.problem is None, step.problem
    assert counter.frame_count == 1
    with torch.inference_mode():  # serve's engine thread decodes in inference mode
        real[:, 0] = True
        step(torch.tensor([1, 2]), torch.tensor([0, 0]), 0)
    assert counter.frame_count == 1


@cuda
@pytest.mark.cuda
@torch.inference_mode()
def test_on_a_gpu_the_compiled_steps_decode_as_the_plain_ones(model, batch_model, monkeypatch):
    """CUDA graphs (mode="reduce-overhead") over the static cache: one row and serve's batch (compiled in its
    thread, run on this one), as on the CPU; no step falls back from CUDA graphs, and a second window's new
    buffers re-record the graph without compiling it again."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    skips = counters["inductor"]["cudagraph_skips"]
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 products, as on the CPU
    on_gpu = random_model(BATCH_CONFIG).cuda()
    plain, fast = SlotBatch(on_gpu, ROWS, VOCAB), SlotBatch(on_gpu, ROWS, VOCAB)
    fast.fast_step = compiled_step.bind_rows(on_gpu, fast.cache, fast.real, force=True)
    assert fast.fast_step.ready.wait(timeout=600) and fast.fast_step.problem is None, fast.fast_step.problem
    decode_joining_and_leaving([plain, fast], tolerance=1e-4)
    one = random_model(CONFIG).cuda()
    reference, cache = KVCache(CONFIG, 1, 24, torch.float32, "cuda"), KVCache(CONFIG, 1, 24, torch.float32, "cuda")
    step = compiled_step.CompiledDecoderStep(one, cache, background=False)
    token = 9
    for _ in range(12):
        expected = one.unembed(one.decode(torch.tensor([[token]], device="cuda"), cache=reference)[:, -1])
        got = step(token)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
        token = int(expected.argmax())
        assert int(got.argmax()) == token
    graphs = counters["stats"]["unique_graphs"]
    reference, again = (
        KVCache(CONFIG, 1, 24, torch.float32, "cuda"),
        compiled_step.CompiledDecoderStep(one, KVCache(CONFIG, 1, 24, torch.float32, "cuda"), background=False),
    )
    for token in (9, 4, 7):
        expected = one.unembed(one.decode(torch.tensor([[token]], device="cuda"), cache=reference)[:, -1])
        torch.testing.assert_close(again(token), expected, rtol=0, atol=1e-4)
    assert counters["stats"]["unique_graphs"] == graphs  # the new window's buffers: re-recorded, not compiled again
    assert counters["inductor"]["cudagraph_skips"] == skips, "a step ran without CUDA graphs (TORCH_LOGS=cudagraphs says why)"


def test_info_device_lists_the_compiled_steps_decisions_with_their_compile_time(cli, monkeypatch):
    import tfcli.accel

    one_row = "compiled-step cpu float32 decoder-step t1 L1 d16"
    rows = "compiled-rows16 cpu float32 decoder-step t1 L1 d16"
    decisions = {
        "decoder-step t1 L1 d16": choices.Decision(decode_step.NATIVE, {"torch": 0.002, "native": 0.001}),
        one_row: choices.Decision(decode_step.NATIVE, {"torch": 0.002, "native": 0.001, "compiled": 0.0015}, compile_seconds=12.5),
        rows: choices.Decision(compiled_step.COMPILED, {"torch": 0.02, "compiled": 0.01}, compile_seconds=21.0),
    }
    report = {
        "processor": "a CPU",
        "vector_extensions": ["avx2"],
        "torch": torch.__version__,
        "threads": 1,
        "accel": "on",
        "c_decoder_step": "tfcli's C decoder step (native.c), where a model's shape measures faster with it",
        "decisions_file": "/nowhere/choices.json",
        "notes": [],
        "decisions": {key: decision.to_json() for key, decision in decisions.items()},
    }
    monkeypatch.setattr(tfcli.accel, "report", lambda: report)
    shown = cli("info", "--device")
    assert shown.code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "one row: native chosen, compiled in 12.5 s" in text and "16 rows: compiled chosen, compiled in 21.0 s" in text
    assert "decoding tfcli's C decoder step" in text and "21.0 s" in text
    data = json.loads(cli("info", "--device", "--json").stdout)
    assert data["decisions"][rows]["compile_seconds"] == 21.0


def test_a_decisions_file_from_another_version_keeps_what_this_one_reads_and_what_it_does_not(tmp_path):
    """A decision with a key this version does not know (a newer tfcli's) is left out here, and measured
    again if needed, while the file's other decisions are used; writing keeps it as it was, so versions
    sharing the file never erase each other's measurements."""
    path = tmp_path / "choices.json"
    known = choices.Decision(decode_step.NATIVE, {"torch": 0.002, "native": 0.001})
    newer = {"choice": "compiled", "seconds": {"torch": 0.02, "compiled": 0.01}, "note": "", "compile_seconds": 3.0, "graphs": 2}
    path.write_text(json.dumps({"version": choices.VERSION, "processor": "x", "torch": torch.__version__, "decisions": {"a": known.to_json(), "b": newer}}))
    store = choices.Choices(path, torch.__version__)
    assert store.decisions == {"a": known}
    assert any("'b'" in note and "graphs" in note for note in store.notes), store.notes
    store.record("c", choices.Decision(decode_step.TORCH, {"torch": 0.5}))
    on_disk = json.loads(path.read_text())["decisions"]
    assert on_disk["b"] == newer and on_disk["a"] == known.to_json() and on_disk["c"]["choice"] == decode_step.TORCH
    assert choices.Choices(path, torch.__version__).decisions == {"a": known, "c": store.decisions["c"]}


def test_bench_generates_compiled_job_decodes_with_the_compiled_step_over_the_cache(tmp_path, monkeypatch):
    """`tfcli bench generate`'s tfcli-compiled job, in-process, with the step run eagerly instead of compiled
    (the plumbing, not the compiler): it decodes with the step over the KV cache, the tokens tfcli's uncached
    job decodes."""
    from tfcli.bench import generate as bench

    steps = []

    def eager(*args):
        steps.append(1)
        return compiled_step._step(*args)

    monkeypatch.setattr(compiled_step, "compiled_function", lambda device: eager)
    monkeypatch.setattr(compiled_step, "compile_seconds", {})
    run, hf, _, weight_bytes = bench.prepare(tmp_path, "tiny", 4, 12)
    compiled = bench._decode_job("tfcli-compiled", run, hf, 4, 12, 1, "cpu", weight_bytes)
    assert compiled.new_tokens == 12 and compiled.compile_seconds > 0 and "torch.compile" in compiled.kernel
    assert len(steps) >= 3 * 11  # every token after the first of each timed call went through the step
    uncached = bench._decode_job("tfcli-no-cache", run, hf, 4, 12, 1, "cpu", weight_bytes)
    assert compiled.first_tokens == uncached.first_tokens
