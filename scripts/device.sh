#!/usr/bin/env bash
# Prepare a bare GPU machine, check it, and run the GPU suite, the simulated device's storm at
# full size and the demo (with --bench, the benchmarks too), all in one call.
#
#   bash scripts/device.sh [--bench] [--scenarios] [--no-storm] [--smoke FILE]
#                          [--bench-only SECTIONS] [-- extra pytest args]
#
#   --scenarios   run only the reliability scenarios: tests/gpu/test_reliability.py (in-process
#                 on the three loops, plain anyio.run in fresh processes, SIGINT) and the sim storm
#   --no-storm    leave out the simulated device's storm (it needs no GPU; CI runs it smaller)
#   --smoke FILE  prepare the machine, then run only that Python script
#   --bench-only SECTIONS
#                 prepare the machine, then run only `aiocudasem bench --sections SECTIONS`
#                 (main, curve, service, signal; comma-separated), with $BENCH_ARGS added (say
#                 "--loops asyncio,trio --repeats 3": the main section on all three loops
#                 takes about 11 minutes, more than one call of the device may run); its files
#                 come back as one archive, $OUT/bench.tar.gz, and its log as $OUT/bench.log
#   --bench       also run the benchmarks after the demo (outside the budget below: lower
#                 DEVICE_BUDGET_S to leave them room within the device's per-call limit)
#
# The machine has no network: scripts/fetch-device-deps.sh, run beforehand on a machine that
# has one, puts the wheels and the Vulkan/GL packages under .device/. Logs go to $OUT (or
# ./out): gpu.txt, doctor.txt, vulkan-check.txt, gpu-tests.log, scenarios.jsonl, sim-storm.log,
# demo.log, summary.txt. The whole call stays within $DEVICE_BUDGET_S seconds (default 570);
# each stage gets what is left, and a stage that runs out is interrupted (SIGINT) so that pytest
# still writes its summary.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
bench=0; smoke=""; scenarios=0; storm=1; bench_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1; shift ;;
    --scenarios) scenarios=1; shift ;;
    --no-storm) storm=0; shift ;;
    --smoke) smoke=$2; shift 2 ;;
    --bench-only) bench_only=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
budget=${DEVICE_BUDGET_S:-570}
left() { echo $(( budget - SECONDS )); }
die() {
  echo "FATAL: $*" | tee -a "$OUT/summary.txt" >&2
  exit 1
}
# Run "$@" with a time limit of $1 seconds (at least 10); SIGINT first, SIGKILL 15 s later.
limited() {
  local t=$1; shift
  [ "$t" -lt 10 ] && t=10
  timeout -k 15 -s INT "$t" "$@"
}
# The last "=== ... in 12.3s ===" line of a pytest log, without the "=" padding.
counts() {
  local line
  line=$(grep -E '^=+ .*[0-9]+ (passed|failed|error|errors|skipped|deselected).* in [0-9.]+s' "$1" 2>/dev/null | tail -1 | sed -E 's/^=+ //; s/ =+$//')
  echo "${line:-no pytest summary (crashed or killed?)}"
}

echo "== preparing the device"
compgen -G ".device/whl/*.whl" >/dev/null \
  || die ".device/whl/ is missing or has no wheels: run scripts/fetch-device-deps.sh on a machine with network access and carry .device/ along"
compgen -G ".device/gl/*.deb" >/dev/null \
  || die ".device/gl/ is missing or has no .deb packages: run scripts/fetch-device-deps.sh on a machine with network access and carry .device/ along"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .device/whl/*.whl || die "installing .device/whl/*.whl failed"
export PYTHONPATH=/tmp/site:$PWD

# NVIDIA's Vulkan driver needs the loader and the glvnd dispatch libraries; with the loader
# alone vkCreateInstance fails with VK_ERROR_INCOMPATIBLE_DRIVER.
gl_libs="libvulkan.so.1 libGLX.so.0 libEGL.so.1 libGLdispatch.so.0"
gl_missing() {
  local lib missing=""
  for lib in $gl_libs; do
    # One awk that reads all of ldconfig's output: `grep -q` could exit early, and the SIGPIPE
    # it leaves upstream would fail the pipeline under pipefail.
    ldconfig -p | awk -v lib="$lib" '$1 == lib {found = 1} END {exit !found}' \
      || missing="$missing $lib"
  done
  echo "$missing"
}
missing=$(gl_missing)
if [ -n "$missing" ]; then
  echo "missing:$missing; unpacking every package of .device/gl/"
  for f in .device/gl/*.deb; do
    dpkg -x "$f" / || die "dpkg -x $f / failed (this needs root)"
  done
  ldconfig || die "ldconfig failed"
  missing=$(gl_missing)
  [ -z "$missing" ] || die "still missing after unpacking .device/gl/:$missing"
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
# The suite runs under the driver's default module loading mode (lazy), as users run.
for v in CUDA_MODULE_LOADING CUDA_MODULE_DATA_LOADING; do
  if [ -n "${!v+x}" ]; then
    echo "note: $v=${!v} was set in the environment; unsetting it"
    unset "$v"
  fi
done
export PYTHONUNBUFFERED=1
python3 setup.py -q build_ext --inplace 2>&1 | tail -5 || die "building the C extension failed"

nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import sys, anyio, numpy, cuda.bindings, pytest; from importlib.metadata import version; print(sys.version.split()[0], "anyio", version("anyio"), "numpy", numpy.__version__, "cuda-bindings", cuda.bindings.__version__, "pytest", pytest.__version__)' | tee -a "$OUT/gpu.txt"
python3 -c '
from cuda.bindings._v2 import driver as d
d.init(0)
mode = int(d.module_get_loading_mode())
print("CUDA module loading mode:", {1: "eager", 2: "lazy"}.get(mode, "unknown"), f"({mode})")
' 2>&1 | tee -a "$OUT/gpu.txt" || die "could not query the CUDA module loading mode"
echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-<unset>} __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-<unset>}" | tee -a "$OUT/gpu.txt"
python3 -m aiocudasem doctor 2>&1 | tee "$OUT/doctor.txt"

# A smoke script runs on the prepared machine even if Vulkan is broken (to debug that).
if [ -n "$smoke" ]; then
  python3 "$smoke" 2>&1 | tee "$OUT/smoke.log"
  exit $?
fi

# The benchmarks alone, within the budget; one archive of their files (the device returns a
# limited number of files).
if [ -n "$bench_only" ]; then
  rm -rf "$OUT/bench"
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
  limited "$(left)" python3 -m aiocudasem bench --driver cuda --sections "$bench_only" \
    ${BENCH_ARGS:-} --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
  rc=${PIPESTATUS[0]}
  if [ -d "$OUT/bench" ]; then
    tar -czf "$OUT/bench.tar.gz" -C "$OUT" bench && rm -rf "$OUT/bench"
  fi
  echo "SUMMARY: bench --sections $bench_only ${BENCH_ARGS:-}: exit $rc, ${SECONDS}s" | tee -a "$OUT/summary.txt"
  exit "$rc"
fi

echo "== checking Vulkan against CUDA device 0"
python3 - <<'EOF' 2>&1 | tee "$OUT/vulkan-check.txt" || die "no usable Vulkan device for CUDA device 0 (see $OUT/vulkan-check.txt and $OUT/doctor.txt); not running the suite"
import os
import sys

import anyio

import aiocudasem as acs
from aiocudasem.vulkan import VulkanDevice

try:
    cuda = acs.get_driver("cuda")
    uuid = cuda.device_uuid(0)
except acs.AiocudasemError as exc:
    sys.exit(f"FATAL: CUDA device 0 is not usable: {exc}")
try:
    vk = VulkanDevice.open(uuid=uuid)
except acs.AiocudasemError as exc:
    sys.exit(
        f"FATAL: no Vulkan device with CUDA device 0's UUID {uuid.hex()} that can export "
        f"timeline and binary semaphores: {exc}\n"
        f"VK_DRIVER_FILES={os.environ.get('VK_DRIVER_FILES', '<unset>')}"
    )
with vk:
    for sem in (vk.create_timeline_semaphore(), vk.create_binary_semaphore()):
        kind = acs.HandleType.TIMELINE_SEMAPHORE_FD if sem.is_timeline else acs.HandleType.OPAQUE_FD
        fd = sem.export_fd()
        try:
            imported = acs.import_semaphore(kind, fd, driver=cuda)
        except acs.AiocudasemError as exc:
            os.close(fd)
            sys.exit(f"FATAL: CUDA cannot import an exported Vulkan {kind.name} semaphore: {exc}")
        anyio.run(imported.aclose)
        sem.close()
    version = ".".join(map(str, vk.api_version))
    print(
        f"vulkan: {vk.name} (Vulkan {version}), UUID {vk.uuid.hex()} = CUDA device 0; "
        "timeline and binary semaphores export and import into CUDA"
    )
EOF

export AIOCUDASEM_SCENARIO_LOG=$OUT/scenarios.jsonl
: > "$AIOCUDASEM_SCENARIO_LOG"
status=0
demo_reserve=$(( scenarios ? 0 : 50 ))  # seconds kept for the demo
storm_reserve=$(( storm ? 150 : 0 ))  # and for the sim storm (6 runs of 100000 cycles)
if [ "$scenarios" = 1 ]; then
  echo "== reliability scenarios on the GPU"
  suite=(-m gpu tests/gpu/test_reliability.py)
else
  echo "== GPU suite"
  suite=(-m gpu tests)
fi
limited $(( $(left) - storm_reserve - demo_reserve )) python3 -m pytest -p no:cacheprovider -v --durations=25 \
  "${suite[@]}" "$@" 2>&1 | tee "$OUT/gpu-tests.log"
rc=${PIPESTATUS[0]}
suite_note=""
[ "$rc" = 0 ] || status=1
[ "$rc" = 124 ] && suite_note=" (OUT OF TIME: interrupted)"

storm_note=""
if [ "$storm" = 1 ]; then
  echo "== reliability storm on the simulated device, 100000 cycles"
  AIOCUDASEM_STORM_CYCLES=100000 limited $(( $(left) - demo_reserve )) python3 -m pytest \
    -p no:cacheprovider -v --durations=10 tests/test_reliability_sim.py -k storm 2>&1 \
    | tee "$OUT/sim-storm.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || status=1
  [ "$rc" = 124 ] && storm_note=" (OUT OF TIME: interrupted)"
else
  echo "no storm run (--no-storm)" > "$OUT/sim-storm.log"
fi

demo="skipped"
if [ "$scenarios" = 0 ]; then
  echo "== demo"
  limited $(( $(left) - 5 )) python3 -m aiocudasem demo 2>&1 | tee "$OUT/demo.log"
  case ${PIPESTATUS[0]} in
    0) demo="ok" ;;
    124) demo="OUT OF TIME"; status=1 ;;
    *) demo="FAILED"; status=1 ;;
  esac
fi
if [ "$bench" = 1 ]; then
  echo "== benchmarks"
  python3 -m aiocudasem bench --out "$OUT" 2>&1 | tee "$OUT/bench.log" || status=1
fi

echo "== scenario figures ($OUT/scenarios.jsonl)"
python3 -c 'import sys; from tests.scenarios import summarize; summarize(sys.argv[1])' \
  "$AIOCUDASEM_SCENARIO_LOG" 2>&1 | tee -a "$OUT/summary.txt"
storm_counts="not run (--no-storm)"
[ "$storm" = 1 ] && storm_counts="$(counts "$OUT/sim-storm.log")$storm_note"
summary="SUMMARY: gpu $( [ "$scenarios" = 1 ] && echo scenarios || echo suite ): $(counts "$OUT/gpu-tests.log")$suite_note | sim storm x100000: $storm_counts | demo: $demo | ${SECONDS}s | exit $status"
echo "$summary" | tee -a "$OUT/summary.txt"
exit $status
