#!/usr/bin/env bash
# One device call (issue 34, part 3): exhaustive, verified measurements of whole tuning spaces
# of 1,000+ configs, for the pruned tuner's offline replay (benchmarks/perfmodel.py
# pruned_rows), within BUDGET_S (default 330 s) on an H100 with 16 cores and cold Triton /
# NVRTC caches. Every config of the space is built in a process pool (WORKERS processes,
# default nproc - 2: one core each for the measuring worker and the main process), then checked
# bit for bit against lowbit.reference and timed (median, L2 flushed) in a crash-isolated
# worker as soon as its build is done (benchmarks/tuning.py measure). Steps, each under
# `timeout` and within what is left of the budget; a failing or cut step does not stop the
# next, and tuning.py rewrites its tables file every 10 s, so a cut run keeps its rows (the
# layer's "exhaustive" then is false):
#   1. bits    cuda.bitserial_wgmma on perfmodel.py's mbv2_pw_28_144to32_b8 at w1a2 (bit-plane
#              operands, bias + ReLU -> u2 bit planes): 1,352 configs, NVRTC ~0.2 s a build
#              (the cheaper space: first; at most BITS_S = 150 s, leaving the tma step
#              >= 150 s)
#   2. tma     triton.conv2d_int8_tma on resnet18_b8's resnet18_56x56_64to64_s1 (bias + ReLU ->
#              s8): 1,776 configs, Triton ~0.4-0.8 s a build
#   3. extra   only with >= EXTRA_MIN_S (150 s) left, enough to finish it before the replay:
#              cuda.bitserial_mma_sync_persistent on perfmodel.py's densenet_56_128to32_b8 at
#              w1a2 (a 3x3 conv): 1,392 configs
#   4. replay  only with >= 35 s left: benchmarks/perfmodel.py --pruned-only over the tree's
#              results plus this call's tables (CPU): the pruned_tuner rows
# Expected on an H100 (16 cores): ~10 s set-up, bits ~75 s, tma ~110 s, replay ~25 s (extra,
# ~85 s, then usually skipped): ~220 s in all. Builds (14 processes) outpace the measuring
# worker (~40 ms a config: load, verify, 3 ms warm-up + 15 ms of L2-flushed runs), so a step
# takes about its space x the measure time plus ~15 s of start-up; each step's log and
# summary.txt give the measured seconds per config (compile and measure).
# Env: BUDGET_S, BITS_S, WORKERS, EXTRA_MIN_S; BITS / TMA / EXTRA = "TEMPLATE SUITE LAYER
# PRECISION" override a step's space (EXTRA= or REPLAY=0 skip those steps).
# Outputs under $OUT: tables-*.json (to commit under benchmarks/results/<gpu>/), the replay's
# perfmodel-*.json, and, not for the tree, logs/: summary.txt (steps, exit codes, seconds, each
# space's counts), one log per step.
set -u
OUT=${OUT:-/tmp/lowbit-out}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
START=$(date +%s)
BUDGET_S=${BUDGET_S:-330}
BITS_S=${BITS_S:-150}
EXTRA_MIN_S=${EXTRA_MIN_S:-150}
GRACE_S=25  # per step: imports before tuning.py's clock starts, and its shutdown
SUMMARY="$LOGS/summary.txt"
CORES=$(nproc)
WORKERS=${WORKERS:-$(( CORES > 3 ? CORES - 2 : 1 ))}
BITS=${BITS-cuda.bitserial_wgmma perfmodel_new mbv2_pw_28_144to32_b8 w1a2}
TMA=${TMA-triton.conv2d_int8_tma resnet18_b8 resnet18_56x56_64to64_s1 w8a8}
EXTRA=${EXTRA-cuda.bitserial_mma_sync_persistent perfmodel_new densenet_56_128to32_b8 w1a2}

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }

{
  echo "start $(date -u +%FT%TZ), budget ${BUDGET_S}s, $CORES cores, $WORKERS compile processes"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl 2>&1 | tail -3 || echo "wheel install failed"
  else
    echo "no .whl/: xgboost (the replay's model) must be in the image"
  fi
} >> "$SUMMARY" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export LOWBIT_RESULTS_DIR="$OUT"
# the device's copy of .git can be stale: pass LOWBIT_GIT_SHA from the calling machine
export LOWBIT_GIT_SHA=${LOWBIT_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "setup done at $(elapsed)s" >> "$SUMMARY"

# measure NAME CAP_S RESERVE_S "TEMPLATE SUITE LAYER PRECISION": tuning.py measure of that space
# with --budget-s min(CAP_S, time left - RESERVE_S - GRACE_S), under a hard timeout GRACE_S
# later; log in $LOGS/NAME.log
measure() {
  local name=$1 cap=$2 reserve=$3 spec=$4
  [ -z "$spec" ] && { echo "$name skipped (no space named)" >> "$SUMMARY"; return; }
  local template suite layer precision
  read -r template suite layer precision <<< "$spec"
  local budget=$(( $(left) - reserve - GRACE_S ))
  (( budget > cap )) && budget=$cap
  if (( budget < 30 )); then
    echo "$name skipped (no time left) at $(elapsed)s" >> "$SUMMARY"
    return
  fi
  local t0=$(date +%s)
  timeout -k 5 $(( budget + GRACE_S )) python3 benchmarks/tuning.py measure \
    --template "$template" --suites "$suite" --layers "$layer" --precision "$precision" \
    --budget-s "$budget" --workers "$WORKERS" >> "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name ($template on $layer $precision, budget ${budget}s) rc=$rc" \
    "($(case $rc in 0) echo ok;; 124|137) echo "cut by timeout";; *) echo failed;; esac))" \
    "$(( $(date +%s) - t0 ))s," \
    "at $(elapsed)s" >> "$SUMMARY"
  grep -E "configs \(|compile: " "$LOGS/$name.log" | tail -3 >> "$SUMMARY"
}

measure bits "$BITS_S" 150 "$BITS"
measure tma 600 5 "$TMA"
if (( $(left) >= EXTRA_MIN_S )); then
  measure extra 600 40 "$EXTRA"
else
  echo "extra skipped ($(left)s left < ${EXTRA_MIN_S}s) at $(elapsed)s" >> "$SUMMARY"
fi

# the pruned tuner's replay over the tree's results and this call's tables, in a scratch copy
# (the tree stays as it came)
if [ "${REPLAY:-1}" = 1 ] && (( $(left) >= 35 )) && compgen -G "$OUT/tables-*.json" > /dev/null
then
  scratch=$(mktemp -d)
  cp -r benchmarks/results/. "$scratch/"
  mkdir -p "$scratch/space_session"
  cp "$OUT"/tables-*.json "$scratch/space_session/"
  t0=$(date +%s)
  timeout -k 5 $(( $(left) - 3 )) python3 benchmarks/perfmodel.py --pruned-only \
    --results "$scratch" --out "$OUT" >> "$LOGS/replay.log" 2>&1
  echo "replay rc=$? $(( $(date +%s) - t0 ))s, at $(elapsed)s" >> "$SUMMARY"
  tail -6 "$LOGS/replay.log" >> "$SUMMARY"
  rm -rf "$scratch"
else
  echo "replay skipped at $(elapsed)s" >> "$SUMMARY"
fi

# each table's counts (what the coordinator commits)
python3 - "$OUT" >> "$SUMMARY" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
for p in sorted(Path(sys.argv[1]).glob("tables-*.json")):
    d = json.loads(p.read_text())
    for l in d["layers"]:
        print(f"{p.name} {l['template']} {l['workload']}: {l.get('measured')}/"
              f"{l['space_size']} rows, {l.get('failed')} failed, exhaustive "
              f"{l['exhaustive']}, best {l.get('best_us')} us, {l.get('wall_s')} s, "
              f"compile {d.get('compile_s_per_config')} s/config ({d.get('workers')} procs), "
              f"measure {l.get('measure_s_per_config')} s/config")
EOF
echo "end at $(elapsed)s" >> "$SUMMARY"
exit 0
