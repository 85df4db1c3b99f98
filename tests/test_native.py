"""The C matrix-vector kernel (native.c): its values, when linear layers use it, and how it is built, cached and
refused (no compiler, a failed build, a damaged cache, a wrong result)."""

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import forget_accel
from tfcli.accel import accelerate, build, decode_step, native, products
from tfcli.model.attention import KVCache
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import Transformer


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The kernel forgotten and its cache empty, so the next use builds it again."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(cache))
    monkeypatch.delenv("TFCLI_NATIVE_KERNELS", raising=False)
    forget_accel()
    yield cache
    forget_accel()


@pytest.fixture
def kernel(buildable):
    built = native.vector_linear()
    assert built is not None, native.problem()
    return built


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("n,k", [(1, 1), (5, 17), (203, 77), (768, 768), (300, 1000)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_kernel_matches_torch(kernel, threads, n, k, with_bias, n_threads):
    threads(n_threads)
    generator = torch.Generator().manual_seed(n * k)
    x = torch.randn(1, 1, k, generator=generator)
    weight = torch.randn(n + 3, k, generator=generator)[3:]  # a view that starts inside its storage
    bias = torch.randn(n, generator=generator) if with_bias else None
    for parallel_from in (0, native.PARALLEL_FROM):
        got = kernel(x, weight, bias, parallel_from=parallel_from)
        assert got.shape == (1, 1, n)
        assert torch.allclose(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_kernel_reads_a_strided_row(kernel):
    rows = torch.randn(4, 300)
    weight = torch.randn(50, 150)
    x = rows[2:3, ::2]  # (1, 150), every other element
    assert torch.allclose(kernel(x, weight), F.linear(x, weight), atol=1e-4)


def native_for_one_row(direction, m, n, k, with_bias=False):
    """The choice the measurement makes where the C loop wins: one row, forward."""
    return products.NATIVE if direction == "forward" and m == 1 else products.TORCH


def test_linear_sends_one_row_to_the_kernel_where_it_was_chosen(monkeypatch):
    calls = []

    def counted(x, weight, bias=None):
        calls.append(tuple(x.shape))
        return F.linear(x, weight, bias)

    monkeypatch.setattr(native, "vector_linear", lambda: counted)
    monkeypatch.setattr(products, "choose", native_for_one_row)
    weight = torch.randn(2048, 256)
    products.linear(torch.randn(1, 256), weight)
    products.linear(torch.randn(1, 1, 256), weight, torch.randn(2048))
    assert calls == [(1, 256), (1, 1, 256)]
    products.linear(torch.randn(2, 256), weight)  # two rows
    products.linear(torch.randn(1, 256).double(), weight.double())
    products.linear(torch.randn(1, 256, requires_grad=True), weight)  # a gradient is asked for
    products.linear(torch.randn(1, 256), torch.randn(256, 2048).t())  # a transposed (strided) weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        products.linear(torch.randn(1, 256), weight)
    assert len(calls) == 2
    with torch.no_grad():
        products.linear(torch.randn(1, 256, requires_grad=True), weight)
    assert len(calls) == 3


def test_linear_without_the_kernel_is_still_right(monkeypatch):
    monkeypatch.setattr(native, "vector_linear", lambda: None)
    x, weight, bias = torch.randn(1, 256), torch.randn(512, 256), torch.randn(512)
    assert torch.allclose(products.linear(x, weight, bias), F.linear(x, weight, bias), atol=1e-4)


def test_cached_decoding_gives_the_same_logits_with_and_without_the_kernel(kernel, monkeypatch):
    config = ModelConfig(vocab_size=4096, block_size=32, n_layers=2, n_heads=4, d_model=128, d_ff=4096, dropout=0.0)
    torch.manual_seed(0)
    model = accelerate(Transformer(config).eval())
    ids = torch.randint(0, 4096, (1, 12))

    def decode_one_by_one():
        cache = KVCache(config, 1, 32, torch.float32)
        with torch.inference_mode():
            model.decode(ids[:, :4], cache=cache)
            return torch.stack([model.lm_head(model.decode(ids[:, t : t + 1], cache=cache))[0, 0] for t in range(4, 12)])

    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(native, "vector_linear", lambda: counted)
    monkeypatch.setattr(products, "choose", native_for_one_row)
    with_kernel = decode_one_by_one()
    assert len(calls) == 8 * 9  # per token: both layers' four projections and the output layer
    monkeypatch.setattr(products, "choose", lambda *args, **kwargs: products.TORCH)
    without = decode_one_by_one()
    assert torch.allclose(with_kernel, without, rtol=1e-5, atol=1e-5)
    assert torch.equal(with_kernel.argmax(-1), without.argmax(-1))


def test_the_build_is_cached_and_reused(buildable, fresh, monkeypatch):
    assert native.vector_linear() is not None
    built = sorted((fresh / "kernels").iterdir())
    assert [p.suffix for p in built] == [".lock", ".so", ".sha256"]  # no partial file left beside them
    assert built[1].stat().st_mode & 0o777 == 0o755  # other users may load it too
    forget_accel()

    def no_compiling(*args, **kwargs):
        raise AssertionError("the cached build should have been used")

    monkeypatch.setattr(build.subprocess, "Popen", no_compiling)
    assert native.vector_linear() is not None and native.problem() is None


def test_a_damaged_build_is_made_again(buildable, fresh):
    assert native.vector_linear() is not None
    library = next((fresh / "kernels").glob("*.so"))
    damaged = library.with_name("damaged")
    damaged.write_bytes(library.read_bytes()[:8000])  # cut off: loading it would crash with a bus error
    os.replace(damaged, library)  # a new file: the one this process loaded stays mapped as it was
    # A new process (this one would reuse the library it has loaded under that name):
    check = "from tfcli.accel import native; print(native.problem())"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr
    assert library.read_bytes()[:4] == b"\x7fELF"


def test_an_unusable_cache_folder_builds_for_this_process_only(buildable, fresh, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(tmp_path / "a-file" / "cache"))  # cannot be made
    assert native.vector_linear() is not None, native.problem()


def test_a_folder_anyone_can_write_to_is_not_trusted(buildable, fresh):
    (fresh / "kernels").mkdir(parents=True)
    (fresh / "kernels").chmod(0o777)  # another user could have planted a library there
    assert native.vector_linear() is not None, native.problem()
    assert not any((fresh / "kernels").iterdir())  # built for this process only, elsewhere


def test_no_compiler_keeps_onednn(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(fresh / "no-such-compiler"))
    assert native.vector_linear() is None
    assert "no C compiler" in native.problem() and "set CC" in native.problem()
    assert decode_step.describe().startswith("PyTorch's step (no C code: no C compiler")
    x, weight = torch.randn(1, 256), torch.randn(512, 256)
    assert torch.allclose(products.linear(x, weight), F.linear(x, weight), atol=1e-4)
    assert not (fresh / "kernels").exists() or all(p.suffix == ".lock" for p in (fresh / "kernels").iterdir())  # no partial file left


def test_a_compiler_that_cannot_start_for_now_is_not_remembered(fresh, monkeypatch):
    def out_of_processes(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(build.subprocess, "Popen", out_of_processes)
    assert native.vector_linear() is None
    assert "could not start" in native.problem()
    assert not (fresh / "kernels").exists() or not any(p.suffix == ".failed" for p in (fresh / "kernels").iterdir())
    monkeypatch.undo()
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(fresh))
    forget_accel()  # the next process builds it
    assert native.vector_linear() is not None, native.problem()


@pytest.mark.skipif(shutil.which("false") is None, reason="no `false` program")
def test_a_failed_build_is_remembered_and_not_tried_again(fresh, monkeypatch):
    monkeypatch.setenv("CC", shutil.which("false"))
    assert native.vector_linear() is None
    assert "could not build it" in native.problem()
    (failed,) = [p for p in (fresh / "kernels").iterdir() if p.suffix != ".lock"]  # the reason, and no partial library
    assert failed.suffix == ".failed"
    forget_accel()  # as a new process would start

    def no_compiling(*args, **kwargs):
        raise AssertionError("a build that failed must not run the compiler again")

    monkeypatch.setattr(build.subprocess, "Popen", no_compiling)
    assert native.vector_linear() is None
    assert "could not build it" in native.problem() and "remembered" in native.problem() and str(failed) in native.problem()
    failed.unlink()  # what the message says to do to try again
    forget_accel()
    assert native.vector_linear() is None and "AssertionError" in native.problem()


def test_a_compiler_without_openmp_builds_the_serial_version(buildable, fresh, monkeypatch, tmp_path):
    compiler = tmp_path / "cc-without-openmp"
    real = shutil.which(os.environ.get("CC") or "cc") or "cc"
    compiler.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && {{ echo "unsupported option -fopenmp" >&2; exit 1; }}; done\nexec {real} "$@"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    assert native.vector_linear() is not None, native.problem()
    (library,) = (fresh / "kernels").glob("*.so")
    assert not any(name.startswith("libgomp") for name in native.elf_names(library)[1])  # no OpenMP runtime needed
    x, weight = torch.randn(1, 300), torch.randn(700, 300)
    assert torch.allclose(native.vector_linear()(x, weight, parallel_from=0), F.linear(x, weight), atol=1e-4)


def test_an_openmp_runtime_other_than_pytorchs_is_refused_before_loading(buildable, fresh, monkeypatch):
    monkeypatch.setattr(native, "openmp_runtimes", lambda: {"/opt/intel/lib/libiomp5.so"})

    def no_loading(*args, **kwargs):
        raise AssertionError("the library must not be loaded")

    monkeypatch.setattr(build.ctypes, "CDLL", no_loading)
    assert native.vector_linear() is None
    assert "needs libgomp.so.1 while PyTorch runs libiomp5.so" in native.problem()


def test_turned_off_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv("TFCLI_NATIVE_KERNELS", "0")
    assert native.vector_linear() is None
    assert native.problem() == "turned off by TFCLI_NATIVE_KERNELS"


def test_a_build_that_disagrees_with_torch_is_refused(buildable, fresh, monkeypatch, tmp_path):
    wrong = tmp_path / "wrong.c"
    wrong.write_text(
        "void vector_linear(const float *w, const float *x, const float *bias, float *y, long n, long k, int threads, long from) {\n"
        "    for (long i = 0; i < n; i++) y[i] = 0.0f;\n"
        "}\n"
        "long decoder_workspace(const void *m) { return 1; }\n"
        "int decoder_step(const void *m, long token, long position, float *logits, float *workspace, int threads, long from) { return 0; }\n"
        "int quant_parallel(const void *f, int fmt, const void *w, long rb, const float *x, float *y, long m, long n, long k, int t, long from) { return 0; }\n"
    )
    monkeypatch.setattr(native, "SOURCE", wrong)
    assert native.vector_linear() is None
    assert native.problem() == "the built kernel disagreed with PyTorch"


def test_a_compiler_with_arguments(buildable, fresh, monkeypatch):
    monkeypatch.setenv("CC", f"{shutil.which(os.environ.get('CC') or 'cc') or 'cc'} -Wall")
    assert native.vector_linear() is not None, native.problem()


def test_a_hanging_compiler_is_stopped_with_what_it_started(fresh, monkeypatch, tmp_path):
    pid_file = tmp_path / "child.pid"
    compiler = tmp_path / "slow-cc"
    compiler.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setattr(native, "BUILD_TIMEOUT_S", 1)
    assert native.vector_linear() is None
    assert native.problem().endswith("took more than 1 s")
    child = int(pid_file.read_text())
    for _ in range(50):  # killed at once; its exit may take a moment to be collected
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the compiler's own child process was left running")


def test_any_failure_leaves_decoding_to_onednn_with_a_reason(fresh, monkeypatch):
    def broken():
        raise PermissionError(13, "Permission denied", "/somewhere")

    monkeypatch.setattr(native, "_build_and_load", broken)
    assert native.vector_linear() is None and native.vector_linear() is None
    assert native.problem().startswith("PermissionError")
    assert decode_step.describe().startswith("PyTorch's step (no C code: PermissionError")


def test_a_second_openmp_runtime_is_refused(buildable, fresh, monkeypatch):
    seen = iter([{"/torch/lib/libgomp.so.1"}] * 2 + [{"/torch/lib/libgomp.so.1", "/usr/lib/libiomp5.so"}] * 10)  # before the load, then after
    monkeypatch.setattr(native, "openmp_runtimes", lambda: next(seen))
    assert native.vector_linear() is None
    assert native.problem().startswith("it brought a second OpenMP runtime (/usr/lib/libiomp5.so)")


def test_another_librarys_own_runtime_does_not_turn_it_off(buildable, fresh, monkeypatch):
    """sentencepiece ships its own libgomp: once it is loaded, the C code still loads beside torch's runtime."""
    monkeypatch.setattr(native, "openmp_runtimes", lambda: {"/torch/lib/libgomp.so.1", "/sp/sentencepiece.libs/libgomp-6a29c32d.so.1.0.0"})
    assert native.vector_linear() is not None, native.problem()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_only_products_torch_would_accept_reach_the_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(native, "vector_linear", lambda: lambda *args: calls.append(1))
    monkeypatch.setattr(products, "choose", native_for_one_row)
    weight = torch.randn(2048, 256)
    with pytest.raises(RuntimeError):
        products.linear(torch.randn(1, 128), weight)  # the shapes do not fit: PyTorch's own error
    x, bias = torch.randn(1, 256), torch.randn(1)
    assert torch.allclose(products.linear(x, weight, bias), F.linear(x, weight, bias), atol=1e-4)  # a broadcast bias
    with pytest.raises((RuntimeError, NotImplementedError)):
        products.linear(x, weight, torch.randn(2048, device="meta"))
    traced = torch.jit.trace(lambda a: products.linear(a, weight), (torch.randn(1, 256),), check_trace=False)
    other = torch.randn(1, 256)
    assert torch.allclose(traced(other), F.linear(other, weight), atol=1e-4)  # traced as PyTorch's product
    assert calls == []


# The one build (tfcli/accel/build.py) serves word2vec's kernel as it serves native.c: checked, remembered, and
# built once however many processes want it at once.


@pytest.fixture
def word2vec_kernel(fresh, monkeypatch):
    """word2vec's kernel forgotten in this process (a library loaded before stays loaded), its cache empty."""
    from tfcli.word2vec import kernel

    monkeypatch.setattr(kernel, "_function", None)
    return kernel


def logging_compiler(folder, log, body='exec "$REAL" "$@"'):
    """A `CC` that writes each call's arguments to `log` (a line a call), then runs `body`."""
    script = folder / "logging-cc"
    real = shutil.which(os.environ.get("CC") or "cc") or "cc"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nREAL={real}\n{body}\n')
    script.chmod(0o755)
    return script


def test_a_damaged_word2vec_library_is_built_again_not_loaded(buildable, word2vec_kernel, fresh):
    assert word2vec_kernel.train_span_function() is not None
    (library,) = (fresh / "kernels").glob("word2vec-*.so")
    assert build.intact(library)  # its digest was written beside it
    damaged = library.with_name("damaged")
    damaged.write_bytes(library.read_bytes()[:8000])  # cut off: loading it would crash with a bus error
    os.replace(damaged, library)
    assert not build.intact(library)
    check = "from tfcli.word2vec.kernel import train_span_function; train_span_function(); print('trained')"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr
    assert build.intact(library) and library.stat().st_size > 8000
    assert [p.name for p in (fresh / "kernels").glob("*.failed")] == []


def test_a_failed_word2vec_build_is_one_line_and_remembered(word2vec_kernel, fresh, monkeypatch, tmp_path):
    from tfcli.errors import TfcliError

    log = tmp_path / "calls.log"
    broken = logging_compiler(tmp_path, log, "echo \"kernel.c:12:5: error: expected ';' before '}' token\" >&2\necho '   12 | int x' >&2\nexit 1")
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(TfcliError) as first:
        word2vec_kernel.train_span_function()
    assert first.value.message == f"{broken} could not build the word2vec kernel: kernel.c:12:5: error: expected ';' before '}}' token"
    assert "set CC to another C compiler" in first.value.hint and "\n" not in str(first.value)
    (failed,) = (fresh / "kernels").glob("word2vec-*.failed")
    with pytest.raises(TfcliError) as again:  # as a new process would ask: the compiler does not run again
        word2vec_kernel.train_span_function()
    assert again.value.message.startswith(first.value.message) and "remembered" in again.value.message
    assert f"delete {failed}" in again.value.message + again.value.hint
    assert len(log.read_text().splitlines()) == 1


def test_no_compiler_for_word2vec_says_so_and_is_not_remembered(word2vec_kernel, fresh, monkeypatch):
    from tfcli.errors import TfcliError

    monkeypatch.setenv("CC", str(fresh / "no-such-compiler"))
    with pytest.raises(TfcliError) as missing:
        word2vec_kernel.train_span_function()
    assert missing.value.message.startswith("word2vec training needs a C compiler") and "install gcc or clang" in missing.value.hint
    assert not any((fresh / "kernels").glob("*.failed"))


def test_two_processes_that_build_at_once_compile_once(buildable, fresh, tmp_path):
    log = tmp_path / "calls.log"
    slow = logging_compiler(tmp_path, log, 'sleep 1\nexec "$REAL" "$@"')  # slow enough for the other process to come meanwhile
    environment = {**os.environ, "CC": str(slow), "TFCLI_CACHE_DIR": str(fresh)}
    code = "from tfcli.accel import native\nfrom tfcli.word2vec.kernel import train_span_function\ntrain_span_function()\nprint(native.problem())\n"
    processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment) for _ in range(2)]
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0 and out.strip() == "None", err
    builds: dict[str, set[str]] = {}  # each source's builds, told apart by their output files (one per build, whatever flags it tries)
    for call in log.read_text().splitlines():
        words = call.split()
        builds.setdefault(os.path.basename(words[-2]), set()).add(words[words.index("-o") + 1])
    assert {source: len(outputs) for source, outputs in builds.items()} == {"kernel.c": 1, "native.c": 1}
    assert len(list((fresh / "kernels").glob("*.so"))) == 2


def test_a_choice_another_process_measured_meanwhile_is_read_not_measured_again(fresh, monkeypatch):
    from tfcli.accel import choices

    path = choices.choices_path()
    first, second = (choices.Choices(path, torch.__version__) for _ in range(2))  # both read the file before either measured
    candidates = {"torch": lambda: 1.0, "other": lambda: 1.0}
    chosen = first.decide("shared work", candidates, lambda a, b: a == b)
    monkeypatch.setattr(choices, "measure", lambda *args, **kwargs: pytest.fail("measured again"))
    assert second.decide("shared work", candidates, lambda a, b: a == b) == chosen
    assert second.decisions["shared work"] == first.decisions["shared work"]
    monkeypatch.undo()
    monkeypatch.setenv("TFCLI_CACHE_DIR", str(fresh))
    second.decide("second's own work", candidates, lambda a, b: a == b)
    assert set(choices.ChoicesFile.load(path).decisions) == {"shared work", "second's own work"}  # neither write lost the other's
    assert path.with_suffix(".lock").exists()  # measured under the file's lock
