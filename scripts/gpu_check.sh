#!/usr/bin/env bash
# The GPU half of issue #48 in one go, for a session that is lent a CUDA GPU (about 8 minutes on an H100):
# the card, driver and torch; the tests marked `cuda` (the compiled decoding steps as CUDA graphs); `bench
# generate` at batch 1 (the compiled step tuned beside PyTorch's) and at 16 rows (`--batch 16`: ms per step
# beside transformers' generate on the same 16 prompts); `bench train --precision bf16` at gpt2-small
# (tokens/s and MFU); `bench serve` at 1 and 16 clients with the compiled batch step tuned for 16 rows
# (serve's continuous batch). Each step has its own time limit, so
# one that hangs leaves time for the rest; every output lands under $OUT (summary.txt: each step's exit
# code and seconds).
#
#   bash scripts/gpu_check.sh                                 # on the GPU machine: OUT=... chosen by the caller
#   DEVICE=cpu TINY=1 OUT=/tmp/gpu-check bash scripts/gpu_check.sh   # the same commands at tiny settings on a CPU
#
# The MFU `bench train` reports is against the fastest matmul it measured on the device; the card's dense
# bf16 peak (989 TFLOPS for an H100 SXM) is in machine.txt's card name, for the figure the issue asks.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
if [ "${TINY:-0}" = 1 ]; then  # the dry run on a CPU: tiny settings, one generous limit for every step
    PRESET=tiny NEW_TOKENS=8 TRAIN_BATCH=2 TRAIN_STEPS=1 CLIENTS=1,2 REQUESTS=1 ROWS=2 DRY_LIMIT=300
else  # the step limits below add up to 8 minutes
    PRESET=gpt2-small NEW_TOKENS=128 TRAIN_BATCH=16 TRAIN_STEPS=10 CLIENTS=1,16 REQUESTS=2 ROWS=16 DRY_LIMIT=
fi
mkdir -p "$OUT"
: >"$OUT/summary.txt"

step() {  # step NAME SECONDS COMMAND...: stdout to NAME.out, stderr to NAME.err, a line in summary.txt
    local name=$1 seconds=$2 started=$SECONDS
    shift 2
    [ -n "$DRY_LIMIT" ] && seconds=$DRY_LIMIT
    echo "== $name: $*" | tee -a "$OUT/summary.txt"
    timeout "$seconds" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    local code=$?
    echo "   $name: exit $code in $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
    [ "$code" = 0 ] || tail -5 "$OUT/$name.err"
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    lscpu | grep 'Model name' || true
    "$PY" -c "import tfcli, transformers, httpx, uvicorn; print('tfcli and its test tools import')" || echo "MISSING: install tfcli with its extras first"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

step tests 80 "$PY" -m pytest -q -n 0 -m cuda -rs tests/test_compiled_step.py
step generate 130 "$PY" -m tfcli bench generate --device "$DEVICE" --preset "$PRESET" --new-tokens "$NEW_TOKENS" --json
# the 16-row figure: no compiling (the compiled step decodes one row) and no uncached job (a quick run skips it past 20M parameters)
step generate16 60 "$PY" -m tfcli bench generate --device "$DEVICE" --preset "$PRESET" --new-tokens "$NEW_TOKENS" --batch "$ROWS" --skip-no-cache --json
step train 80 "$PY" -m tfcli bench train --presets "$PRESET" --precision bf16 --device "$DEVICE" --batch "$TRAIN_BATCH" --steps "$TRAIN_STEPS" --json
step run 25 "$PY" -m tfcli.bench.generate prepare "$OUT/work" "$PRESET" 16 "$NEW_TOKENS"
RUN=$("$PY" -c "import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['run'])" "$OUT/run.out" 2>/dev/null || echo "$OUT/work/run")
step serve 105 "$PY" -m tfcli bench serve "$RUN" --device "$DEVICE" --clients "$CLIENTS" --requests "$REQUESTS" --max-tokens "$NEW_TOKENS" --compiled --json
rm -rf "$OUT/work"
echo "done in $SECONDS s; outputs in $OUT" | tee -a "$OUT/summary.txt"
