#!/usr/bin/env bash
# The reference bench on a lent GPU machine (the workplace's `device` tool), in calls of at most
# 10 minutes each: every call resumes where the last one stopped, until it prints
# "bench complete". Results land in $OUT (and in build/device-results/ on the machine, which
# survives between calls while it stays warm); commit them as benchmarks/results/reference-cuda.*.
#
#   scripts/device_bench.sh --fetch      # here, once: the device machine has torch, click,
#                                        # pathspec and matplotlib but no libcst, and no network
#   device run, carry [".whl"], command: # there, repeated until "bench complete"
#       REPEATS=2 scripts/device_bench.sh
#
# Measured on an H200 (2026-11-30): a fresh machine took about 30 s to start; REPEATS=2 measured
# 5 workloads in one 9-minute call (7 to 10 runs each, 8-55 s a run, most of it Python's start
# and compiling). A session's 15 device minutes hold about one such call and a short second one.
#
# REPEATS (default 3) runs of each version; ABLATE=1 also measures each rule alone (about 3x
# the time: a workload whose ablation does not fit in one call never completes, so measure
# without it first and ablate under another NAME). BUDGET: seconds this call may spend (540);
# ORDER: the workloads to measure, in order (default: all of them, the issue-16 ones first);
# SEED and RERUN: resume from a committed results file (its REPEATS) less the workloads named.
#   ORDER="resnet_cifar naive_gpt mmdit_ddp" REPEATS=2 RERUN=resnet_cifar \
#       SEED=benchmarks/results/reference-cuda.json scripts/device_bench.sh
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
# The package as an install lays it out: the rules (top-level transforms/) inside it.
rm -rf /tmp/src && mkdir -p /tmp/src && cp -r optimizer_codemod /tmp/src/ &&
    cp -r transforms /tmp/src/optimizer_codemod/transforms || exit 1
export PYTHONPATH="/tmp/site:/tmp/src" PYTHONUNBUFFERED=1
results=build/device-results
name=${NAME:-reference-cuda}
mkdir -p "$results"
# A fresh machine has no results: SEED (a committed results file) is resumed from instead, less
# the workloads RERUN names (measured before a fix that changes them).
if [ -n "${SEED:-}" ] && [ ! -s "$results/$name.json" ]; then
    python3 - "$SEED" "$results/$name.json" ${RERUN:-} <<'EOF' || exit 1
import json, sys
data = json.load(open(sys.argv[1]))
data["workloads"] = [w for w in data["workloads"] if w["name"] not in sys.argv[3:]]
json.dump(data, open(sys.argv[2], "w"), indent=1)
EOF
fi
deadline=$((SECONDS + ${BUDGET:-540}))
ablate=()
[ "${ABLATE:-0}" = 1 ] && ablate=(--ablate)
# One workload per bench call, in ORDER (the issue's must-show workloads first), so a call cut
# short by the budget has finished whole workloads; --resume merges them into one results file.
status=0
for workload in ${ORDER:-sudoku_diffusion sgld_mnist char_transformer resnet_cifar vision_bdh naive_gpt mmdit_ddp}; do
    left=$((deadline - SECONDS))
    [ "$left" -gt 30 ] || break
    timeout "$left" python3 -P -m optimizer_codemod bench "reference_models/$workload" --device cuda \
        --repeats "${REPEATS:-3}" "${ablate[@]}" --timeout 300 --resume \
        --output "$results" --name "$name" || status=$?
done
# doctor's compile checks take a while on a fresh machine: only with time to spare.
if [ ! -s "$results/doctor-cuda.txt" ] && [ $((deadline - SECONDS)) -gt 90 ]; then
    timeout $((deadline - SECONDS - 10)) python3 -P -m optimizer_codemod doctor --compile-timeout 60 \
        >"$results/doctor-cuda.txt" 2>&1
fi
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
