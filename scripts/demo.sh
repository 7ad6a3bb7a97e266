#!/usr/bin/env bash
# The showcase `make demo` runs: profile a zoo net, then (as the engine grows) predict, plan, train.
set -euo pipefail
VENV=${1:-.venv}
OUT=${2:-demo-out}
LP="$VENV/bin/layerplan"
mkdir -p "$OUT"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
step "$LP" zoo
step "$LP" profile alexnet --plot "$OUT/alexnet-profile.png" --save "$OUT/alexnet.json"
step "$LP" hardware
echo
echo "plots and specs are in $OUT/"
