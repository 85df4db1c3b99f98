#!/usr/bin/env bash
# Refresh requirements/test.txt, the lock the README's test command and .ci/run install from: every tool the
# `test` extra names and all they need, pinned with hashes, for CPython 3.11 and newer on any platform.
#
#   bash scripts/lock.sh                            # keep every pin pyproject.toml still allows; add what it newly names
#   bash scripts/lock.sh --upgrade                  # the newest versions its ranges allow
#   bash scripts/lock.sh --upgrade-package pytest   # move one, keep the others
#
# torch is left out of the lock: it is installed first, on its own (`pip install torch==2.13.0`, or the CUDA
# build a GPU machine needs), and the lock is resolved against the wheel that pip command takes here, so the
# lock never asks for another torch or for its CUDA libraries. After a refresh, install it and run the suite
# (the README's test command) before committing: the lock is what CI passed.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=2.13.0
python3 -m pip install --quiet uv
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download --quiet --no-deps --dest "$wheels" "torch==$TORCH"
torch_wheel=$(basename "$(ls "$wheels"/torch-*.whl)")
torch_version=$(echo "$torch_wheel" | cut -d- -f2)  # with its local tag (2.13.0+cpu) where pip took a CPU build
echo "torch==$torch_version" >"$wheels/override.txt"
python3 -m uv pip compile pyproject.toml --extra test --universal --python-version 3.11 --generate-hashes \
  --find-links "$wheels" --override "$wheels/override.txt" --no-emit-package torch \
  --custom-compile-command "bash scripts/lock.sh" "$@" -o requirements/test.txt
echo "wrote requirements/test.txt; now run the README's test command on it"
