#!/usr/bin/env bash
# Prepare a bare GPU machine and run the GPU suite (and, with --bench, the benchmarks).
#
#   bash scripts/device.sh [--bench] [--smoke FILE] [-- extra pytest args]
#
# The machine has no network: scripts/fetch-device-deps.sh, run beforehand on a machine that
# has one, puts the wheels and the Vulkan loader under .device/. Logs go to $OUT (or ./out).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
bench=0; smoke=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1; shift ;;
    --smoke) smoke=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

echo "== preparing the device"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .device/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
if ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in .device/gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
export PYTHONUNBUFFERED=1
python3 setup.py -q build_ext --inplace 2>&1 | tail -5 || exit 1
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import sys, anyio, numpy, cuda.bindings, pytest; print(sys.version.split()[0], "anyio", anyio.__version__ if hasattr(anyio, "__version__") else "?", "numpy", numpy.__version__, "cuda-bindings", cuda.bindings.__version__, "pytest", pytest.__version__)' | tee -a "$OUT/gpu.txt"

if [ -n "$smoke" ]; then
  python3 "$smoke" 2>&1 | tee "$OUT/smoke.log"
  exit $?
fi

status=0
echo "== GPU suite"
python3 -m pytest -m gpu -p no:cacheprovider -v tests "$@" 2>&1 | tee "$OUT/gpu-tests.log" || status=1
echo "== demo"
python3 -m aiocudasem demo 2>&1 | tee "$OUT/demo.log" || status=1
if [ "$bench" = 1 ]; then
  echo "== benchmarks"
  python3 -m aiocudasem bench --out "$OUT" 2>&1 | tee "$OUT/bench.log" || status=1
fi
exit $status
