#!/usr/bin/env bash
# The GPU half of issue #48 in one go, for a session that is lent a CUDA GPU (about 8.5 minutes): the card,
# driver and torch; the tests marked `cuda` (the compiled decoding steps as CUDA graphs); `bench generate` at
# batch 1 (the compiled step tuned beside PyTorch's) and at 16 rows (`--batch 16`: ms per step beside
# transformers' generate on the same 16 prompts); `bench train --precision bf16 --batch max --compile` at
# gpt2-small (the largest batch that fits, found first without compiling; then both loops compiled by
# torch.compile at that batch, their compile time apart; tokens/s, MFU against the fastest matmul measured and
# against the card's datasheet dense bf16 peak); `bench serve` at 1 and 16 clients with the compiled batch
# step tuned for 16 rows (serve's continuous batch); last, where the budget has time left, the same training
# rows uncompiled. Each step has its own time limit, so one that hangs leaves time for the rest.
#
# What comes back is at most 8 files: $OUT/figures.json (the machine, every step's command, exit code, seconds
# and stderr tail, every bench's --json output and the headline figures: scripts/gpu_figures.py),
# $OUT/summary.txt and $OUT/logs.tar.gz (each step's stdout and stderr). The headline is printed at the end.
#
# The lent machine's image lacks serve's FastAPI and uvicorn and can fetch nothing: carry them as wheels.
#
#   bash scripts/gpu_wheels.sh                                       # here, once: .whl/ (ignored by git)
#   device run: command "bash scripts/gpu_check.sh", carry [".whl"]  # $OUT is the device tool's
#   DEVICE=cpu TINY=1 OUT=/tmp/gpu-check bash scripts/gpu_check.sh   # the same commands at tiny settings on a CPU
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
if [ "${TINY:-0}" = 1 ]; then  # the dry run on a CPU: tiny settings, one generous limit for every step
    PRESET=tiny NEW_TOKENS=8 MAX_BATCH=2 FIXED_BATCH=2 TRAIN_STEPS=1 CLIENTS=1,2 REQUESTS=1 ROWS=2 DRY_LIMIT=300
else  # the step limits below add up to BUDGET, 8.5 minutes (the uncompiled training rows run only in what is left)
    PRESET=gpt2-small NEW_TOKENS=128 MAX_BATCH=512 FIXED_BATCH=32 TRAIN_STEPS=10 CLIENTS=1,16 REQUESTS=2 ROWS=16 DRY_LIMIT=
fi
BUDGET=510  # seconds: tests 75 + generate 120 + generate16 45 + train 165 + run 20 + serve 85
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=$(mktemp -d)  # the steps' own files: packed into $OUT/logs.tar.gz at the end (few files come back from $OUT)
: >"$LOGS/summary.txt"

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # the carried wheels (scripts/gpu_wheels.sh)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tfcli-site .whl/*.whl \
        && export PYTHONPATH=/tmp/tfcli-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: stdout to NAME.out, stderr to NAME.err, a line in summary.txt; its exit code
    local name=$1 seconds=$2 started=$SECONDS
    shift 2
    [ -n "$DRY_LIMIT" ] && seconds=$DRY_LIMIT
    echo "== $name: $*" | tee -a "$LOGS/summary.txt"
    timeout -k 10 "$seconds" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err"  # the whole process group: workers and servers too
    local code=$?
    echo "   $name: exit $code in $((SECONDS - started)) s" | tee -a "$LOGS/summary.txt"
    [ "$code" = 0 ] || tail -5 "$LOGS/$name.err"
    return "$code"
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    lscpu | grep 'Model name' || true
    "$PY" -c "import tfcli, transformers, httpx, fastapi, uvicorn; print('tfcli and its test tools import')" \
        || echo "MISSING: carry the wheels scripts/gpu_wheels.sh downloads (.whl), or install tfcli with its extras"
} >"$LOGS/machine.txt" 2>&1
cat "$LOGS/machine.txt"

step tests 75 "$PY" -m pytest -q -n 0 -m cuda -rs -p no:cacheprovider tests/test_compiled_step.py
step generate 120 "$PY" -m tfcli bench generate --device "$DEVICE" --preset "$PRESET" --new-tokens "$NEW_TOKENS" --json
# the 16-row figure: no compiling (the compiled step decodes one row) and no uncached job (a quick run skips it past 20M parameters)
step generate16 45 "$PY" -m tfcli bench generate --device "$DEVICE" --preset "$PRESET" --new-tokens "$NEW_TOKENS" --batch "$ROWS" --skip-no-cache --json
# the largest batch that fits (doubling from 1 until out of memory, at most MAX_BATCH; not compiled), then both
# loops compiled at that batch: each compiles in its 3 warm-up steps (tens of seconds), its compile time reported apart
if step train 165 "$PY" -m tfcli bench train --presets "$PRESET" --precision bf16 --device "$DEVICE" --batch max --max-batch "$MAX_BATCH" --steps "$TRAIN_STEPS" --compile --json; then
    LARGEST=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['batch'])" "$LOGS/train.out" 2>/dev/null || echo "$FIXED_BATCH")
else
    # the search or the compiling failed: a batch that surely fits, uncompiled, still gives a training figure
    step train_fixed 50 "$PY" -m tfcli bench train --presets "$PRESET" --precision bf16 --device "$DEVICE" --batch "$FIXED_BATCH" --steps "$TRAIN_STEPS" --json
    LARGEST=
fi
step run 20 "$PY" -m tfcli.bench.generate prepare "$LOGS/work" "$PRESET" 16 "$NEW_TOKENS"
RUN=$("$PY" -c "import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['run'])" "$LOGS/run.out" 2>/dev/null || echo "$LOGS/work/run")
step serve 85 "$PY" -m tfcli bench serve "$RUN" --device "$DEVICE" --clients "$CLIENTS" --requests "$REQUESTS" --max-tokens "$NEW_TOKENS" --compiled --json
rm -rf "$LOGS/work"
# the training rows uncompiled at the same batch, in the time the budget has left (at least 40 s; the dry run always)
LEFT=$((BUDGET - SECONDS))
if [ -n "$LARGEST" ] && { [ -n "$DRY_LIMIT" ] || [ "$LEFT" -ge 40 ]; }; then
    step train_eager "$((LEFT < 60 ? LEFT : 60))" "$PY" -m tfcli bench train --presets "$PRESET" --precision bf16 --device "$DEVICE" --batch "$LARGEST" --steps "$TRAIN_STEPS" --no-first-run --json
else
    echo "   train_eager: not run ($LEFT s of the budget left)" | tee -a "$LOGS/summary.txt"
fi
echo "done in $SECONDS s; outputs in $OUT" | tee -a "$LOGS/summary.txt"
cp "$LOGS/summary.txt" "$OUT/summary.txt"
"$PY" scripts/gpu_figures.py "$LOGS" "$OUT" || echo "could not collect the figures: the logs are in $OUT/logs.tar.gz"
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
rm -rf "$LOGS"
