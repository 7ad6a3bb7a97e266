#!/usr/bin/env bash
# The showcase `make demo` runs: profile a network, predict every strategy on a cluster, plan,
# draw the scaling curves and a timeline, then plan for this machine and run that plan for real.
set -euo pipefail
VENV=${1:-.venv}
OUT=${2:-demo-out}
LP="$VENV/bin/layerplan"
mkdir -p "$OUT"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

# 1. What the network is.
step "$LP" profile alexnet --weighted-only --plot "$OUT/alexnet-profile.png" --save "$OUT/alexnet.json"

# 2. What each strategy would do on 8 TITAN X nodes at 10 Gbit/s, and the best plan.
step "$LP" predict "$OUT/alexnet.json" --strategy stanza --nodes 8 --bandwidth 10Gbit --timeline "$OUT/alexnet-stanza-timeline.png"
step "$LP" plan "$OUT/alexnet.json" --nodes 8 --bandwidth 10Gbit --top 8 -o "$OUT/alexnet-plan.json"
step "$LP" scale "$OUT/alexnet.json" --strategy ps,allreduce,stanza,ralp --workers 1,2,4,8,16,32 --bandwidth 10Gbit \
    --plot "$OUT/alexnet-scaling.png"

# 3. Calibrate this machine (its FLOP/s, alexnet_cifar's layers timed, loopback's rate and CPU cost),
#    plan for it (3 ranks sharing its cores) and run the plan for real on torch.distributed:
#    measured against predicted.
step "$LP" calibrate --quick --repeats 2 --profile alexnet_cifar --profile-batches 16,32 -o "$OUT/here.yaml"
step "$LP" plan alexnet_cifar --cluster "$OUT/here.yaml" --nodes 3 --batch-size 16 \
    --strategies ps,allreduce,stanza,ralp --top 6 -o "$OUT/local-plan.json"
step "$LP" train --plan "$OUT/local-plan.json" --cluster "$OUT/here.yaml" --steps 12 --data digits \
    --metrics-out "$OUT/local-measured.json"
echo
echo "plots, plans and measurements are in $OUT/"
