#!/usr/bin/env bash
# One device call that verifies and times every GPU artifact built on the CPU machine.
#
# On the CPU machine first (each folder is what its step below runs):
#   python benchmarks/gpu_check.py --build build/gpu-l1 --levels level1
#   python benchmarks/gpu_check.py --build build/gpu-l2 --levels level2
#   python benchmarks/gpu_compile.py --targets sm_90a --levels '' --build build/gpu-big \
#       --problem 'SRC/l1_019_ReLU.py:batch_size=8192,dim=16384' ...   (sizes that fill the GPU)
#   python benchmarks/gpu_matmul.py --build build/gpu-mm --target sm_90a --compare-mma-sync
#   (every build/gpu-mm*/ folder with a cases.json is run)
# Then, carrying `build` (under 64 MiB with the repository), on the GPU machine:
#   bash benchmarks/gpu_device.sh [SECONDS_SCALE]
# Each step has its own time cap (scaled by SECONDS_SCALE, default 1), writes its rows as
# JSON lines and its log under $OUT (resumable: rows already saved are skipped), and a
# payload that hangs is saved as failed and the step goes on after it. The last lines
# printed are the failures, the problem-file (bandwidth) rows and the summary.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/stagegraph-gpu-out}
mkdir -p "$OUT"
SCALE=${1:-1}
cap() { python3 -c "print(int($1 * $SCALE))"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total \
    --format=csv 2>&1 | tee "$OUT/env.txt"
python3 -c "import cuda.bindings, numpy, torch; print('cuda-bindings', cuda.bindings.__version__,
'numpy', numpy.__version__, 'torch', torch.__version__)" 2>&1 | tee -a "$OUT/env.txt"

# check DIR NAME SECONDS: gpu_check on DIR, resumed after a hang until the cap is spent.
check() {
    local deadline=$((SECONDS + $3))
    while [ $SECONDS -lt $deadline ]; do
        timeout $((deadline - SECONDS)) python3 benchmarks/gpu_check.py --run "$1" \
            --budget $((deadline - SECONDS - 5)) --repeats 10 --hang 20 --graph \
            --save "$OUT/$2.jsonl" >>"$OUT/$2.log" 2>&1
        [ $? -eq 3 ] || break
    done
    grep -m1 '^GPU:' "$OUT/$2.log"
}

[ -d build/gpu-l1 ] && check build/gpu-l1 l1 "$(cap 130)"
[ -d build/gpu-l2 ] && check build/gpu-l2 l2 "$(cap 80)"
[ -d build/gpu-big ] && check build/gpu-big big "$(cap 60)"
# matmul DIR NAME SECONDS: gpu_matmul on DIR, resumed after a sticky CUDA error.
matmul() {
    local deadline=$((SECONDS + $3))
    while [ $SECONDS -lt $deadline ]; do
        timeout $((deadline - SECONDS)) python3 benchmarks/gpu_matmul.py --run "$1" \
            --repeats 10 --save "$OUT/$2.jsonl" >>"$OUT/$2.log" 2>&1
        [ $? -eq 3 ] || break
    done
}
for dir in build/gpu-mm*/; do
    [ -f "$dir/cases.json" ] && matmul "${dir%/}" "$(basename "$dir")" "$(cap 45)"
done
bandwidth=$(grep -ho 'copy [0-9]* GB/s' "$OUT"/*.log | head -1 | grep -o '[0-9]*')
for rows in "$OUT"/l1.jsonl "$OUT"/l2.jsonl "$OUT"/big.jsonl; do
    [ -f "$rows" ] || continue
    echo "== $(basename "$rows" .jsonl)"
    python3 benchmarks/gpu_check.py --table "$rows" --brief ${bandwidth:+--bandwidth $bandwidth}
done
for log in "$OUT"/gpu-mm*.log; do
    [ -f "$log" ] || continue
    echo "== $(basename "$log" .log)"
    grep -A60 '^case' "$log" | tail -n +1 | cut -c1-160
done
