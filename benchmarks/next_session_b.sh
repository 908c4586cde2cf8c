#!/usr/bin/env bash
# The next device session's second call (~9.5 minutes; after benchmarks/next_session.sh):
# Nsight Compute counters of the block ends (benchmarks/ncu_steps.sh), then ResNet-50 b256
# w1a2 tuned (default / tuned / model plans timed in one process). Results under $OUT; logs
# in $OUT/logs.
#   bash benchmarks/next_session_b.sh; cd $OUT && tar czf logs.tgz logs && rm -rf logs
set -u
OUT=${OUT:-/tmp/lowbit-out}
mkdir -p "$OUT/logs"
START=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$OUT/logs/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests LOWBIT_RESULTS_DIR="$OUT" PYTHONDONTWRITEBYTECODE=1
# run NAME LIMIT CMD...: CMD under min(LIMIT, time left - 10 s), logged to $OUT/logs/NAME.log
run() {
  local name=$1 limit=$2; shift 2
  local budget=$(( $(left) - 10 ))
  (( budget < limit )) && limit=$budget
  (( limit < 20 )) && { echo "$name skipped" >> "$OUT/logs/summary.txt"; return; }
  timeout -k 5 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  echo "$name rc=$? at $(( $(date +%s) - START ))s" >> "$OUT/logs/summary.txt"
}
run ncu 250 env NCU_S=110 bash benchmarks/ncu_steps.sh \
  'resnet50:256:w8a8:res8@layer1_0_conv3,layer2_0_conv3,layer3_0_conv3' \
  'resnet50:256:w1a2:res8@layer1_0_conv3,layer3_0_conv3'
run tune_resnet50 300 python3 benchmarks/tune_network.py --model resnet50 --batch 256 \
  --precision w1a2 --residual-bits 8 --budget 200 --db "$OUT/tune_resnet50.sqlite" --out "$OUT"
exit 0
