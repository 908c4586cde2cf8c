#!/usr/bin/env bash
# Nsight Compute profiles of bit-serial rows (device call): for each "workload:precision:rank"
# argument, the full section set of one launch of its kernel, as a report plus text exports
# (details page; per-SASS-line source counters incl. warp stall samples) under $OUT/ncu/.
#   bash benchmarks/ncu_bitserial.sh resnet50_s2_3x3_b256:w1a1:0 gemm_4096:w1a1:0:PERSIST=1,KT=2
# (overrides: kernel parameters, `lowbit.kernels.cuda.kernel_spec`; the family follows them)
# JSON: $PROFILE_JSON (default: the newest committed bitserial-*.json of this GPU).
# CACHE_CONTROL=none keeps L2 warm between ncu's replay passes, as in CUDA-graph timing (default
# all: caches flushed before each pass, so a small kernel's operands come from DRAM).
set -u -o pipefail
: "${OUT:?OUT must name the results folder}"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
GPU_DIR=benchmarks/results/$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
JSON=${PROFILE_JSON:-$(ls "$GPU_DIR"/bitserial-*.json | sort | tail -1)}
mkdir -p "$OUT/ncu"
for spec in "$@"; do
    IFS=: read -r wl prec rank extra <<<"$spec"
    name="$wl-$prec-$rank${extra:+-$(printf %s "$extra" | md5sum | cut -c1-6)}"
    sets=()  # extra: comma-separated KNOB=VALUE overrides
    IFS=, read -r -a kvs <<<"${extra:-}"
    for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
    echo "=== $name $(date -u +%T)"
    timeout 240 ncu --clock-control none --cache-control "${CACHE_CONTROL:-all}" --set full --import-source yes \
        --kernel-name regex:'bitserial_(persistent|wgmma|wgmma_persistent|kernel|wgmma_shift|wgmma_shift_persistent)$' \
        --launch-skip 2 --launch-count 1 -f -o "$OUT/ncu/$name" \
        python3 benchmarks/profile_bitserial.py --json "$JSON" --workload "$wl" \
        --precision "$prec" --rank "$rank" "${sets[@]}" 2>&1 | tail -4
    ncu -i "$OUT/ncu/$name.ncu-rep" --page details > "$OUT/ncu/$name.details.txt" 2>&1
    ncu -i "$OUT/ncu/$name.ncu-rep" --page source --csv --print-source sass \
        > "$OUT/ncu/$name.sass.csv" 2>&1
    grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible" \
        "$OUT/ncu/$name.details.txt" | head -12
done
