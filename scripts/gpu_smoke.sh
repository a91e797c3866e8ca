#!/usr/bin/env bash
# Short GPU check for a small device budget: build every CUDA example in parallel, then run each through
# `popkit bench --leaderboard` (test -> benchmark -> leaderboard) and print one line per example.
# Usage (repo root, CUDA machine): bash scripts/gpu_smoke.sh OUTDIR [SECRET_RUNS]
# Without network, put the build backend in .whl/ first: python3 -m pip download --no-deps -d .whl hatchling trove-classifiers
set -u
out=${1:-gpu-smoke}; secret=${2:-0}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation . >"$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 1; }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tasks="identity vectoradd grayscale vectorsum softmax matmul"
for t in $tasks; do
  ( cd "submissions/$t" && s=$(date +%s) && MAX_JOBS=3 python3 cuda.py >"$out/build-$t.log" 2>&1; echo "build $t rc=$? $(( $(date +%s) - s )) s" ) &
done
wait
for t in $tasks; do
  popkit bench "submissions/$t/cuda.py" --leaderboard --secret-runs "$secret" --no-history --json >"$out/$t.json" 2>"$out/$t.err"
  python3 - "$out/$t.json" "$t" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
runs = d.get("runs", [])
lb = [r for r in runs if r["mode"] == "leaderboard" and not r["secret"]]
means = [round(b["mean_ns"] / 1e3, 1) for b in (lb[0]["benchmarks"] if lb else []) if b.get("mean_ns")]
fail = next((r["summary"] for r in runs if r["outcome"] != "passed"), "")
print(f"{sys.argv[2]}: {d.get('outcome')} score={d.get('score_public_s')} lb_means_us={means} "
      f"modes={[r['mode'] + ('*' if r['secret'] else '') for r in runs]} {fail}")
PY
done
