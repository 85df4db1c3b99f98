"""`tfcli bench serve`: many clients against one `tfcli serve` process, side by side in one run.

The server runs in its own process (as a user runs it); for each client count, that many clients send
streaming completions at once, each `requests` of them in turn, every one the same prompts, greedy, to
exactly `max_tokens` tokens (`ignore_eos`). Measured per request on the client's clock: the time to its
first token and the time per token after it; per round: the tokens of every request over the round's wall
time, and the server's CPU time (from /proc), since on a shared machine wall time says less than CPU time.

With `compiled`, the batch step compiled by torch.compile (`tfcli.accel.compiled_step.tune_rows`) is tuned
first, in a worker, for the server's --max-batch rows: compiled once (its compile time reported), timed beside
PyTorch's batch step, the faster recorded in tfcli.accel's decisions; the server then decodes with whichever
won, and where that is the compiled step the rounds wait until the server has compiled (or loaded) it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tfcli.accel import compiled_step
from tfcli.bench.common import run_worker
from tfcli.errors import TfcliError
from tfcli.loader import load_run

PROMPTS = (
    "Once upon a time",
    "The little fox found a red ball",
    "Tom had three apples. He gave one",
    "The dog did not like the rain, but",
    "One day, a girl named Mia went to the park",
    "The cat liked to watch",
    "There was a big tree in the garden",
    "Ben and his mom went to the store",
)
START_SECONDS = 300  # the server loads the run, then answers /health


@dataclasses.dataclass
class Round:
    clients: int
    requests: int
    tokens: int
    seconds: float  # wall time of the whole round
    server_cpu_seconds: float
    client_cpu_seconds: float
    ttft_ms: list[float]  # per request: time to its first token
    per_token_ms: list[float]  # per request: (last token - first token) / (tokens - 1)
    busiest_batch: int  # the most rows the server decoded in one step, so far

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_cpu_second(self) -> float:
        return self.tokens / self.server_cpu_seconds if self.server_cpu_seconds else 0.0

    def to_json(self) -> dict:
        return {
            "clients": self.clients,
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "server_cpu_seconds": round(self.server_cpu_seconds, 3),
            "client_cpu_seconds": round(self.client_cpu_seconds, 3),
            "tokens_per_server_cpu_second": round(self.tokens_per_cpu_second, 2),
            "ttft_ms": {"p50": round(percentile(self.ttft_ms, 50), 2), "p99": round(percentile(self.ttft_ms, 99), 2)},
            "per_token_ms": {"p50": round(percentile(self.per_token_ms, 50), 3), "p99": round(percentile(self.per_token_ms, 99), 3)},
            "busiest_batch": self.busiest_batch,
        }


@dataclasses.dataclass
class ServeBench:
    run: str
    model: str
    context: int
    max_tokens: int
    requests_per_client: int
    threads: int
    max_batch: int
    rounds: list[Round]
    device: str = "cpu"
    tuning: dict | None = None  # with `compiled`: the batch step's decision (choice, seconds per candidate, compile_seconds)
    compiled_step: str = "off"  # what the server's /health said of its compiled batch step before the rounds

    def speedup(self, clients: int) -> float | None:
        """Aggregate tokens/s at `clients` over one client's (None without a one-client round)."""
        one = next((r for r in self.rounds if r.clients == 1), None)
        other = next((r for r in self.rounds if r.clients == clients), None)
        if one is None or other is None or not one.tokens_per_second:
            return None
        return other.tokens_per_second / one.tokens_per_second

    def to_json(self) -> dict:
        return {
            "run": self.run,
            "model": self.model,
            "context": self.context,
            "max_tokens": self.max_tokens,
            "requests_per_client": self.requests_per_client,
            "threads": self.threads,
            "max_batch": self.max_batch,
            "device": self.device,
            "tuning": self.tuning,
            "compiled_step": self.compiled_step,
            "rounds": [r.to_json() | {"speedup_over_one_client": _rounded(self.speedup(r.clients))} for r in self.rounds],
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile by linear interpolation (numpy's default). Example: percentile([1, 2, 3, 4], 50) -> 2.5"""
    if not values:
        return 0.0
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its finished children, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5), counted after the name
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    return time.process_time()


def run_serve_bench(
    run: Path,
    *,
    clients: list[int],
    requests: int,
    max_tokens: int,
    threads: int,
    max_batch: int,
    device: str = "cpu",
    compiled: bool = False,
    progress=lambda message: None,
) -> ServeBench:
    import httpx

    tuning = None
    if compiled:
        progress(f"tuning the compiled batch step for {max_batch} rows (compiling it once)")
        tuning = run_worker("tfcli.bench.serve", ["tune", str(run), str(threads), device, str(max_batch)])
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tfcli",
        "serve",
        str(run),
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        "--threads",
        str(threads),
        "--device",
        device,
    ]
    command += ["--max-queue", str(max(64, max(clients) * 2))]
    progress("starting the server")
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        model, context = _wait_for(server, base)
        state = _wait_for_compiled(server, base)
        if max_tokens >= context:
            raise TfcliError(f"--max-tokens {max_tokens} does not fit in the run's context ({context} tokens) with a prompt", hint="ask for fewer")
        rounds = []
        with httpx.Client(timeout=120) as client:  # an untimed request first: the first call's costs stay out
            _check(client.post(base + "/v1/completions", json=_body(model, PROMPTS[0], max_tokens, stream=False)))
        for count in clients:
            progress(f"{count} client{'s' if count > 1 else ''}")
            rounds.append(_round(base, model, server.pid, count, requests, max_tokens))
        return ServeBench(str(run), model, context, max_tokens, requests, threads, max_batch, rounds, device, tuning, state)
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_for(server: subprocess.Popen, base: str) -> tuple[str, int]:
    import httpx

    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            lines = (server.stderr.read() if server.stderr else "").strip().splitlines()
            said = lines[-1].removeprefix("error: ") if lines else f"exit code {server.returncode}"  # its own error line, said once
            raise TfcliError(f"the server did not start: {said}")
        try:
            models = httpx.get(base + "/v1/models", timeout=2).json()["data"][0]
            return models["id"], int(models["max_model_len"])
        except (httpx.HTTPError, KeyError, ValueError):
            time.sleep(0.2)
    raise TfcliError(f"the server did not answer within {START_SECONDS} s")


def _wait_for_compiled(server: subprocess.Popen, base: str) -> str:
    """The server's compiled batch step once it is no longer compiling ("off", "ready" or "failed: ...")."""
    import httpx

    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        state = str(httpx.get(base + "/health", timeout=10).json().get("compiled_step", "off"))
        if state != "compiling" or server.poll() is not None:
            return state
        time.sleep(0.2)
    raise TfcliError(f"the server did not compile its batch step within {START_SECONDS} s")


def _tune_job(run: Path, threads: int, device: str, rows: int) -> dict:
    """Inside a worker: load the run as `tfcli serve` does and tune its compiled batch step for `rows` rows."""
    model = load_run(run, "decode", device, threads).model
    return compiled_step.tune_rows(model, rows).to_json()


def _body(model: str, prompt: str, max_tokens: int, *, stream: bool) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream, "ignore_eos": True}


def _check(response) -> None:
    if response.status_code != 200:
        raise TfcliError(f"the server answered {response.status_code}: {response.text[:300]}")


def _round(base: str, model: str, pid: int, clients: int, requests: int, max_tokens: int) -> Round:
    import httpx

    async def one_request(client: httpx.AsyncClient, prompt: str) -> tuple[float, float | None, float | None, int]:
        sent = time.perf_counter()
        first = last = None
        tokens = 0
        async with client.stream("POST", base + "/v1/completions", json=_body(model, prompt, max_tokens, stream=True)) as response:
            if response.status_code != 200:
                raise TfcliError(f"the server answered {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    raise TfcliError(f"the server failed a request: {chunk['error']['message']}")
                if chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:  # one chunk per token
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    tokens += 1
        return sent, first, last, tokens

    async def one_client(client: httpx.AsyncClient, index: int) -> list:
        return [await one_request(client, PROMPTS[(index + k) % len(PROMPTS)]) for k in range(requests)]

    async def everyone() -> list:
        limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            return await asyncio.gather(*(one_client(client, i) for i in range(clients)))

    cpu_before, own_before = process_cpu_seconds(pid), own_cpu_seconds()
    started = time.perf_counter()
    results = [r for per_client in asyncio.run(everyone()) for r in per_client]
    seconds = time.perf_counter() - started
    cpu_after, own_after = process_cpu_seconds(pid), own_cpu_seconds()
    health = httpx.get(base + "/health", timeout=10).json()
    tokens = sum(r[3] for r in results)
    if tokens != clients * requests * max_tokens:
        raise TfcliError(f"{clients} clients got {tokens} tokens, not the {clients * requests * max_tokens} asked for")
    ttft = [(first - sent) * 1e3 for sent, first, _, _ in results if first is not None]
    per_token = [(last - first) * 1e3 / (n - 1) for _, first, last, n in results if n > 1]
    return Round(clients, len(results), tokens, seconds, cpu_after - cpu_before, own_after - own_before, ttft, per_token, int(health.get("busiest_batch", 0)))


if __name__ == "__main__":
    job, run_arg, threads_arg, device_arg, rows_arg = sys.argv[1:]
    if job != "tune":
        raise SystemExit(f"unknown job {job!r}")
    print(json.dumps(_tune_job(Path(run_arg), int(threads_arg), device_arg, int(rows_arg))))
