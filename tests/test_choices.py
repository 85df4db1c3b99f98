"""tfcli.accel's decisions file: each decision records how busy the machine was while it was timed,
`tfcli info --device` flags those measured busy, and `--forget` removes decisions (all, busy, a kind, a name)
under the file's lock so that the next runs measure them again."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from tests.conftest import forget_accel
from tfcli.accel import choices
from tfcli.accel.build import exclusive
from tfcli.errors import TfcliError

IDLE = {"waited": 0.01, "per_core": 0.2}
BUSY = {"waited": 0.4, "per_core": 1.6}
DECISIONS = {  # one of each kind, as the file holds them; the first without a load, as tfcli wrote them before it recorded one
    "linear forward t2 512x512x256": {"choice": "onednn", "seconds": {"torch": 0.8, "onednn": 0.5}},
    "linear forward t2 1x768x768": {"choice": "native", "seconds": {"torch": 0.14, "native": 0.1}, "load": BUSY},
    "loss t2 cpu float32 64x300x16 gradients": {"choice": "fused", "seconds": {"fused": 1.0, "plain": 1.1}, "load": IDLE},
    "decoder-step t2 L1 d16 h2/2": {"choice": "torch", "seconds": {"torch": 0.002, "native": 0.003}, "load": BUSY},
    "compiled-rows4 cpu float32 decoder-step t2 L1 d16": {"choice": "torch", "seconds": {"torch": 0.02, "compiled": 0.03}, "load": IDLE},
    "quant-int8 q8_0 t2 1x64x64 avx2": {"choice": "avx2", "seconds": {"torch": 0.2, "avx2": 0.1}, "load": {"waited": None, "per_core": 3.0}},
}


@pytest.fixture
def decisions_file(monkeypatch, tmp_path):
    """This machine's decisions file, in a cache folder of the test's own, holding DECISIONS."""
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TFCLI_ACCEL", raising=False)
    forget_accel()
    path = choices.choices_path()
    path.write_text(json.dumps({"version": choices.VERSION, "processor": "x", "torch": torch.__version__, "decisions": DECISIONS}))
    yield path
    forget_accel()


def on_disk(path) -> dict:
    return json.loads(path.read_text())["decisions"]


# --- the load a decision records ---------------------------------------------------------------------------


def test_the_load_is_the_share_of_the_threads_time_spent_waiting_for_a_core(monkeypatch):
    ms = 1_000_000
    times = iter([{"1": (100 * ms, 0), "2": (50 * ms, 10 * ms)}, {"1": (160 * ms, 5 * ms), "2": (50 * ms, 10 * ms), "3": (20 * ms, 15 * ms)}])
    monkeypatch.setattr(choices, "thread_times", lambda: next(times))
    load = choices.machine_load(choices.thread_times())
    assert load.waited == pytest.approx(0.2)  # 20 ms waited against 80 ran (thread 3 started meanwhile: counted from its start)
    assert load.per_core is not None and load.per_core >= 0


def test_a_timing_too_short_to_tell_leaves_the_waiting_unknown(monkeypatch):
    times = iter([{"1": (100, 0)}, {"1": (1_100_000, 900_000)}])  # 2 ms counted: a tick or two
    monkeypatch.setattr(choices, "thread_times", lambda: next(times))
    assert choices.machine_load(choices.thread_times()).waited is None


def test_without_the_threads_times_only_the_load_average_is_recorded(monkeypatch):
    monkeypatch.setattr(choices, "thread_times", lambda: {})  # not Linux
    assert choices.machine_load(choices.thread_times()).waited is None


def test_this_process_threads_times_grow_while_it_runs():
    before = choices.thread_times()
    if not before:
        pytest.skip("this system does not count its threads' time (/proc/self/task/*/schedstat)")
    started = time.perf_counter()
    while time.perf_counter() - started < 0.05:
        pass
    after = choices.thread_times()
    assert sum(ran for ran, _ in after.values()) > sum(ran for ran, _ in before.values())


@pytest.mark.parametrize(
    "load, busy",
    [
        (choices.Load(waited=0.4, per_core=0.1), True),
        (choices.Load(waited=0.02, per_core=4.0), False),  # the threads' own waiting is what counts
        (choices.Load(waited=None, per_core=2.0), True),  # the load average where that is not known
        (choices.Load(waited=None, per_core=0.5), False),
        (choices.Load(), False),
    ],
)
def test_a_busy_machine_is_one_whose_timing_waited_for_a_core(load, busy):
    assert load.busy() is busy
    assert choices.Decision("torch", {"torch": 1.0}, load=load).measured_busy() is busy


def test_a_measured_decision_carries_its_load_into_the_file(tmp_path):
    store = choices.Choices(tmp_path / "choices.json", torch.__version__)
    x = torch.randn(64, 64)
    store.decide("work", {"torch": lambda: x @ x, "other": lambda: x @ x}, lambda a, b: torch.equal(a, b))
    saved = on_disk(tmp_path / "choices.json")["work"]["load"]
    assert set(saved) == {"waited", "per_core"} and saved["per_core"] >= 0
    assert saved["waited"] is None or 0 <= saved["waited"] <= 1
    assert choices.Choices(tmp_path / "choices.json", torch.__version__).decisions["work"] == store.decisions["work"]


def test_a_decision_from_before_loads_were_recorded_reads_fine(decisions_file):
    store = choices.choices()
    assert store.notes == [] and set(store.decisions) == set(DECISIONS)
    old = store.decisions["linear forward t2 512x512x256"]
    assert old.load is None and not old.measured_busy() and old.choice == "onednn"


def test_the_kinds_forget_names_match_the_names_the_work_makes(decisions_file):
    """Decisions measured here by the real code, and the names the decoding steps make, fall in their kinds."""
    from tfcli.accel import compiled_step, decode_step, fused_loss, products
    from tfcli.model.config import ModelConfig
    from tfcli.model.transformer import Transformer

    decisions_file.unlink()
    forget_accel()
    products.choose("forward", 300, 512, 256)
    with torch.no_grad():
        fused_loss.VocabularyLoss().choice(torch.randn(40, 16), torch.randn(300, 16), None, 0.0)
    model = Transformer(ModelConfig(vocab_size=97, block_size=24, n_layers=1, n_heads=2, d_model=16, d_ff=32))
    named = [*choices.choices().decisions, decode_step._shape_key(model), compiled_step.shape_key(model), compiled_step.rows_key(model, 4)]
    kinds = [choices.kind_of(key) for key in named]
    assert kinds[-3:] == ["decoding"] * 3 and set(kinds) == {"products", "loss", "decoding"}, named


# --- info --device flags what was measured busy -------------------------------------------------------------


def test_info_device_flags_the_decisions_measured_on_a_busy_machine(cli, decisions_file, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    shown = cli("info", "--device")
    assert shown.code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "busy: waited 40% for a core" in text and "busy: load 3.00 per core" in text
    assert "waited 1% for a core" in text and "busy: waited 1%" not in text
    assert "3 choices were measured on a busy machine" in text and "tfcli info --device --forget busy" in text
    data = json.loads(cli("info", "--device", "--json").stdout)
    assert data["measured_busy"] == ["decoder-step t2 L1 d16 h2/2", "linear forward t2 1x768x768", "quant-int8 q8_0 t2 1x64x64 avx2"]
    assert data["decisions"]["linear forward t2 1x768x768"]["load"] == BUSY


def test_info_device_says_nothing_of_load_when_none_was_measured_busy(cli, decisions_file, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    idle = {key: {**decision, "load": IDLE} for key, decision in DECISIONS.items()}
    decisions_file.write_text(json.dumps({"version": choices.VERSION, "processor": "x", "torch": torch.__version__, "decisions": idle}))
    shown = cli("info", "--device")
    assert shown.code == 0, shown.stderr
    assert "busy" not in shown.stdout and "waited 1% for a core" in shown.stdout


# --- forgetting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "what, gone",
    [
        (["all"], set(DECISIONS)),
        (["busy"], {"linear forward t2 1x768x768", "decoder-step t2 L1 d16 h2/2", "quant-int8 q8_0 t2 1x64x64 avx2"}),
        (["decoding"], {"decoder-step t2 L1 d16 h2/2", "compiled-rows4 cpu float32 decoder-step t2 L1 d16"}),
        (["products", "quantized"], {"linear forward t2 512x512x256", "linear forward t2 1x768x768", "quant-int8 q8_0 t2 1x64x64 avx2"}),
        (["linear forward t2 1x"], {"linear forward t2 1x768x768"}),  # the start of a name
    ],
)
def test_forget_removes_what_it_names_and_keeps_the_rest(decisions_file, what, gone):
    assert set(choices.forget(decisions_file, what)) == gone
    assert on_disk(decisions_file) == {key: decision for key, decision in DECISIONS.items() if key not in gone}
    forget_accel()
    assert set(choices.choices().decisions) == set(DECISIONS) - gone and choices.choices().notes == []


def test_forget_keeps_the_decisions_another_version_wrote(decisions_file):
    newer = {"choice": "compiled", "seconds": {"torch": 0.02, "compiled": 0.01}, "graphs": 2}
    record = json.loads(decisions_file.read_text())
    record["decisions"]["compiled-step cpu float32 newer"] = newer
    decisions_file.write_text(json.dumps(record))
    assert "compiled-step cpu float32 newer" not in choices.forget(decisions_file, ["busy"])  # its load cannot be read: not known busy
    assert on_disk(decisions_file)["compiled-step cpu float32 newer"] == newer
    assert "compiled-step cpu float32 newer" in choices.forget(decisions_file, ["decoding"])


def test_forget_refuses_a_word_that_names_nothing(decisions_file):
    with pytest.raises(TfcliError) as refused:
        choices.forget(decisions_file, ["decode-step"])
    assert "no decision is 'decode-step'" in refused.value.message and "decoding" in refused.value.hint
    assert on_disk(decisions_file) == DECISIONS
    assert choices.forget(decisions_file.with_name("none.json"), ["busy"]) == []  # no file: nothing measured, nothing to forget


def test_forget_waits_for_a_measurement_that_holds_the_lock(decisions_file, monkeypatch):
    lock = decisions_file.with_suffix(".lock")
    holding = threading.Event()

    def measure_meanwhile():
        with exclusive(lock, wait_s=1):
            holding.set()
            time.sleep(0.3)
            record = json.loads(decisions_file.read_text())  # a measurement writes what the file holds then, and its own
            record["decisions"]["loss t2 cpu float32 new"] = {"choice": "plain", "seconds": {"plain": 1.0}}
            decisions_file.write_text(json.dumps(record))

    measuring = threading.Thread(target=measure_meanwhile)
    measuring.start()
    holding.wait()
    gone = choices.forget(decisions_file, ["loss"])
    measuring.join()
    assert gone == ["loss t2 cpu float32 64x300x16 gradients", "loss t2 cpu float32 new"]  # it waited, then saw the new one too
    monkeypatch.setattr(choices, "LOCK_WAIT_S", 0.1)
    with exclusive(lock, wait_s=1), pytest.raises(TfcliError) as refused:
        choices.forget(decisions_file, ["all"])
    assert "another tfcli process is measuring" in refused.value.message
    assert set(on_disk(decisions_file)) == set(DECISIONS) - {"loss t2 cpu float32 64x300x16 gradients"}


def test_a_spoiled_file_is_not_forgotten_but_said_to_be_measured_again(decisions_file):
    decisions_file.write_text("{not json")
    with pytest.raises(TfcliError) as refused:
        choices.forget(decisions_file, ["all"])
    assert "every decision is measured again anyway" in refused.value.message


def test_info_device_forget_says_in_one_line_what_it_forgot(cli, decisions_file, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    done = cli("info", "--device", "--forget", "busy")
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == f"forgot 3 decisions (decoding 1, products 1, quantized 1) in {decisions_file}: the next runs measure them again"
    assert not any(decision.get("load") == BUSY for decision in on_disk(decisions_file).values())
    again = cli("info", "--device", "--forget", "busy")
    assert again.code == 0 and again.stdout.strip() == f"nothing to forget (busy) in {decisions_file}"
    data = json.loads(cli("info", "--forget", "decoding", "--forget", "loss", "--json").stdout)
    assert data == {
        "decisions_file": str(decisions_file),
        "forgotten": ["compiled-rows4 cpu float32 decoder-step t2 L1 d16", "loss t2 cpu float32 64x300x16 gradients"],
    }
    assert list(on_disk(decisions_file)) == ["linear forward t2 512x512x256"]


def test_info_forget_refuses_in_one_line(cli, decisions_file, tmp_path):
    unknown = cli("info", "--device", "--forget", "everything")
    assert unknown.code == 2 and len(unknown.stderr.strip().splitlines()) == 1 and "no decision is 'everything'" in unknown.stderr
    with_run = cli("info", str(tmp_path), "--forget", "all")
    assert with_run.code == 2 and "--forget forgets this machine's decisions, not a run's" in with_run.stderr
    assert on_disk(decisions_file) == DECISIONS
