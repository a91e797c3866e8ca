#!/usr/bin/env bash
# One device call that installs this checkout's popkit and runs a list of GPU steps, each under its own time
# limit, writing every step's log under RES. Steps are shell commands given as arguments; each runs from the
# repository root with RES exported (a step writes its results there). Prints one line per step (exit code,
# seconds) at the end, and packs RES into $OUT/NAME.tgz when OUT is set (NAME: RES's last folder; the device tool
# brings back few files). Sessions may run side by side (one per GPU, CUDA_VISIBLE_DEVICES set in their steps):
# the first installs popkit, the others wait for it and reuse that install (until popkit's files change).
# Usage (repo root, CUDA machine): bash scripts/gpu_session.sh RES LIMIT_S 'step 1' 'step 2' ...
# Without network, put the build backend in .whl/ first:
#   python3 -m pip download --no-deps -d .whl hatchling trove-classifiers pathspec pluggy packaging
set -u
out=$1; limit=$2; shift 2
mkdir -p "$out"
export RES="$out" PYTHONUNBUFFERED=1
stamp=/tmp/popkit-session-$(cat pyproject.toml $(git ls-files popkit tasks templates 2>/dev/null || find popkit tasks templates -type f | sort) | md5sum | cut -c1-12)
install() {
  [ -e "$stamp" ] && return 0
  python3 -m pip install -q --no-index --no-deps .whl/*.whl >/dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation . >"$out/install.log" 2>&1 \
    || { tail -5 "$out/install.log"; return 1; }
  touch "$stamp"
}
exec 9>/tmp/popkit-session-install.lock
flock 9 && install || exit 1
exec 9>&-
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
summary=()
i=0
for step in "$@"; do
  i=$((i + 1))
  start=$(date +%s)
  timeout -k 10 "$limit" bash -c "$step" >"$out/step$i.log" 2>&1
  rc=$?
  summary+=("step $i rc=$rc $(( $(date +%s) - start )) s: $step")
  tail -4 "$out/step$i.log"
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
if [ -n "${OUT:-}" ]; then
  name=$(basename "$out")
  tar -czf "$OUT/$name.tgz" -C "$(dirname "$out")" "$name"
  cp "$out/summary.txt" "$OUT/summary-$name.txt"
fi
