#!/usr/bin/env bash
# The Python packages scripts/gpu_check.sh needs that the lent GPU machine's image lacks, as wheels for its
# Python (3.12, x86-64 manylinux) at the versions requirements/test.txt pins, into .whl/ (kept out of git by
# .git/info/exclude). That image holds torch, transformers, tokenizers, safetensors, numpy, rich, jinja2,
# httpx and pytest, but not serve's FastAPI and uvicorn (nor pydantic under them), and nothing can be fetched
# there; typer comes too, at the pinned version (tfcli keeps it below 0.29). Run it here, where the registry
# answers, then carry the folder:
#
#   bash scripts/gpu_wheels.sh                                  # here, once
#   device run: command "bash scripts/gpu_check.sh", carry [".whl"]   # gpu_check.sh installs .whl/ first
set -eu
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
PACKAGES="fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn typer"
pins=()
for name in $PACKAGES; do
    pin=$(grep -m1 "^$name==" requirements/test.txt | sed 's/[ ;].*//')
    [ -n "$pin" ] || { echo "requirements/test.txt pins no $name" >&2; exit 2; }
    pins+=("$pin")
done
mkdir -p "$WHEELS"
if [ "$WHEELS" = .whl ] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
    echo '/.whl/' >>.git/info/exclude
fi
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$WHEELS" "${pins[@]}"
ls "$WHEELS"
