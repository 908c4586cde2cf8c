#!/usr/bin/env bash
# The next device session's second call (~9.5 minutes; after benchmarks/next_session.sh):
# Nsight Compute counters of the steps whose bound is in question (benchmarks/ncu_steps.sh),
# the ws stem probe, the Brevitas -> ONNX -> lowbit row on the GPU, then a whole-network tune
# of MobileNet-V2 in what is left. Results under $OUT; logs in $OUT/logs.
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
run ncu 250 env NCU_S=70 bash benchmarks/ncu_steps.sh \
  'resnet50:256:w1a2:res8@conv1,layer1_0_conv3,layer3_0_conv3' \
  'resnet50:256:w1a2:res8:approx@layer1_0_conv3' \
  'tv:mobilenet_v2:64:w8a8@features_2_conv_0_0,features_3_conv_1_0,features_3_conv_2' \
  'tv:resnext50_32x4d:32:w2a2:res8@layer1_0_conv2,layer1_0_conv3'
run stem 60 python3 benchmarks/probes/stem_probe.py --out "$OUT" --outputs u8 u2@u8 \
  --variants ws 'ws band /2' 'ws band 8'
run onnx 90 python3 benchmarks/onnx_bridge.py --epochs 10 --batches 256,4096
run tune_mobilenet 140 python3 benchmarks/tune_network.py --model tv:mobilenet_v2 --batch 64 \
  --precision w8a8 --budget 100 --db "$OUT/tune_mobilenet.sqlite"
exit 0
