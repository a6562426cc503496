#!/usr/bin/env bash
# Gateway load on the lent 16-core device machine (CPU work only: the emulated backend).
# Run from the repository root there, with the wheels the image lacks in .whl/ (see README.md):
#   bash benchmarks/results/serve-load-h100/run.sh "$OUT"
set -u
out=${1:-/tmp/serve-load-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
log="$out/log.txt"
{
  date -u; nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket" || true
} >"$log" 2>&1
# fail fast when a carried wheel is missing (fastapi >= 0.16x imports opentelemetry)
python3 -c "import sys, pydantic, fastapi, uvicorn, uvloop, sloserve.serve.api; print(sys.version.split()[0], pydantic.__version__, fastapi.__version__, uvicorn.__version__, uvloop.__version__)" >>"$log" 2>&1 || { tail -3 "$log"; exit 1; }
# streams, proxy workers: the 2-core figures in docs/performance.md are 100/0, 1000/0,
# 1000/1, 1000/2; here also 4 and 8 workers, which the 2-core box had no cores for.
for cfg in "100 0" "1000 0" "1000 2" "1000 4" "1000 8"; do
  set -- $cfg
  echo "=== streams $1 workers $2 load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
  timeout 150 python3 benchmarks/serve_load.py load --streams "$1" --workers "$2" \
    >>"$log" 2>&1 || echo "exit $?" >>"$log"
done
date -u >>"$log"
