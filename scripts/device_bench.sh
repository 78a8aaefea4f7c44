#!/usr/bin/env bash
# The reference bench on a lent GPU machine (the workplace's `device` tool), in calls of at most
# 10 minutes each: every call resumes where the last one stopped, until it prints
# "bench complete". Results land in $OUT (and in build/device-results/ on the machine, which
# survives between calls while it stays warm); commit them as benchmarks/results/reference-cuda.*.
#
#   scripts/device_bench.sh --fetch      # here, once: the device machine has torch, click,
#                                        # pathspec and matplotlib but no libcst, and no network
#   device run, carry [".whl"], command: # there, repeated until "bench complete"
#       REPEATS=3 ABLATE=1 scripts/device_bench.sh
#
# REPEATS (default 3) runs of each version; ABLATE=1 also measures each rule alone (about 3x
# the time: a workload whose ablation does not fit in one call never completes, so measure
# without it first and ablate under another NAME). BUDGET: seconds this call may spend (540).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fetch" ]; then
    grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >>.git/info/exclude
    exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "libcst==1.9.0"
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
results=build/device-results
name=${NAME:-reference-cuda}
mkdir -p "$results"
[ -s "$results/doctor-cuda.txt" ] ||
    python3 -m optimizer_codemod doctor --compile-timeout 300 >"$results/doctor-cuda.txt" 2>&1
ablate=()
[ "${ABLATE:-0}" = 1 ] && ablate=(--ablate)
timeout "${BUDGET:-540}" python3 -m optimizer_codemod bench reference_models/ --device cuda \
    --repeats "${REPEATS:-3}" "${ablate[@]}" --timeout 300 --resume \
    --output "$results" --name "$name"
status=$?
cp "$results"/* "${OUT:-$results}/" 2>/dev/null
python3 - "$results/$name.json" <<'EOF'
import json, os, sys
from optimizer_codemod.verify.bench import workload_name, workloads
data = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {"workloads": []}
done = {w["name"] for w in data["workloads"]}
todo = [workload_name(f) for f in workloads("reference_models") if workload_name(f) not in done]
print("bench complete" if not todo else f"still to measure: {', '.join(todo)}")
EOF
exit $status
