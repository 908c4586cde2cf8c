#!/usr/bin/env bash
# Nsight Compute counters of chosen network steps as the engine runs them (device call):
# each argument is CASE@STEP,STEP,... (a benchmarks/network.py case, the plan's step names).
#   bash benchmarks/ncu_steps.sh 'resnet50:256:w1a2:res8@layer1_0_conv3' \
#       'tv:mobilenet_v2:64:w8a8@features_2_conv_0_0,features_3_conv_1_0'
# Per case: $OUT/ncu/<case>.ncu-rep and .details.csv, and $OUT/ncu_steps-<case>.json (per
# kernel: step, name, grid, block, the sections' metrics; benchmarks/probes/ncu_steps.py).
# L2 is not flushed between ncu's passes (CACHE_CONTROL=all to flush): in the network a
# step finds its producer's output partly in L2. NCU_S: limit per case (default 150 s).
set -u -o pipefail
: "${OUT:?OUT must name the results folder}"
export PYTHONPATH=${PYTHONPATH:-$PWD/src} PYTHONUNBUFFERED=1
mkdir -p "$OUT/ncu"
for spec in "$@"; do
    case_=${spec%@*}
    steps=${spec#*@}
    tag=$(printf %s "$case_" | tr ':=/' '_--')
    ranges=()
    IFS=, read -r -a names <<<"$steps"
    for n in "${names[@]}"; do
        [[ $n == layer.* ]] || n="layer.$n"
        ranges+=(--nvtx-include "ncu:$n/")
    done
    echo "=== $case_ $(date -u +%T)"
    timeout "${NCU_S:-150}" ncu --clock-control none --cache-control "${CACHE_CONTROL:-none}" \
        --nvtx "${ranges[@]}" --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis -f -o "$OUT/ncu/$tag" \
        python3 benchmarks/probes/ncu_steps.py --case "$case_" --steps "$steps" 2>&1 | tail -5
    ncu -i "$OUT/ncu/$tag.ncu-rep" --page details --csv > "$OUT/ncu/$tag.details.csv" 2>&1 &&
        python3 benchmarks/probes/ncu_steps.py --summarize "$OUT/ncu/$tag.details.csv" \
            "$OUT/ncu_steps-$tag.order.json"
done
