#!/usr/bin/env bash
# The C extensions under AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   bash scripts/sanitize.sh [--rev COMMIT] [pytest arguments...]
#
# Builds _notify, _cucalls, _hostword and _hotpath with -fsanitize=address,undefined in a copy
# of the tree under a temporary directory (the working tree's own extensions, which others may
# be using, are left alone) and runs pytest there, against that build, with the ASan runtime
# preloaded into Python. The copy is the working tree as git sees it (tracked and untracked
# files that are not ignored), or with --rev the tree of that commit. Unless the pytest
# arguments name a test path, it runs the tests that exercise the C code (SANITIZE_TESTS
# below) with -m "not gpu", and the arguments are added (`bash scripts/sanitize.sh -q`);
# `bash scripts/sanitize.sh tests -m "not gpu"` runs the whole CPU suite.
#
# Python's own allocations go through malloc (PYTHONMALLOC=malloc), so that ASan sees the
# objects the extensions touch. Leak detection is off: CPython leaks by design at exit.
# A report halts the process that made it. ASan's reports go to log files, a child's
# included; UBSan's go to stderr (gcc's UBSan runtime beside a preloaded ASan ignores
# log_path), which pytest leaves uncaptured here: one in a child that a test starts shows as
# that child failing. The run fails if pytest fails or if any report was written, and prints
# the reports. Needs gcc (or clang) with its shared ASan runtime, and the virtualenv of
# scripts/_env.sh (.venv, with the test extra). SANITIZE_KEEP=1 keeps the copy afterwards.
set -eu -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

SANITIZE_TESTS=(
  tests/test_hotpath.py
  tests/test_notify.py
  tests/test_cucalls.py
  tests/test_notifier.py
  tests/test_host_timeline.py
  tests/test_stream.py
  tests/test_wakeups.py
  tests/test_cancellation.py
  tests/test_loop_lifetime.py
  tests/test_loop_asyncio.py
  tests/test_semaphore.py
  tests/test_faults.py
  tests/test_abandon.py
  tests/test_exit.py
)

rev=""
if [ "${1:-}" = "--rev" ]; then
  rev=$2
  shift 2
fi
python=${PYTHON:-$root/.venv/bin/python}
cc=${CC:-cc}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -g -O1"
libasan=$("$cc" -print-file-name=libasan.so)
case "$libasan" in
  /*) ;;
  *)
    # clang names its runtime by architecture.
    libasan=$("$cc" -print-file-name="libclang_rt.asan-$(uname -m).so")
    ;;
esac
if [ ! -e "$libasan" ]; then
  echo "sanitize.sh: $cc has no shared ASan runtime (libasan.so): install gcc's libasan"
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/aiocudasem-sanitize.XXXXXX")
trap '[ -n "${SANITIZE_KEEP:-}" ] || rm -rf "$work"' EXIT
tree=$work/tree
mkdir -p "$tree" "$work/reports"
if [ -n "$rev" ]; then
  git archive --format=tar "$rev" | tar -x -C "$tree"
  echo "== copy: commit $(git rev-parse --short "$rev")"
else
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' path; do
    # A tracked file deleted in the working tree is not copied.
    [ -e "$path" ] && printf '%s\0' "$path"
  done | tar -c --null -T - | tar -x -C "$tree"
  echo "== copy: the working tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- || echo ', with its changes')"
fi

echo "== build the extensions with $flags"
cd "$tree"
# setup.py's extensions, built by setuptools' build_ext without the rest of the project's
# configuration (which may need a newer setuptools than the virtualenv has), at the
# optimisation level of $flags.
build_ext='
import runpy
import setuptools

found = {}
setuptools.setup = lambda **kw: found.update(kw)
runpy.run_path("setup.py")
for ext in found["ext_modules"]:
    ext.extra_compile_args = [f for f in ext.extra_compile_args if not f.startswith("-O")]
dist = setuptools.Distribution({"ext_modules": found["ext_modules"]})
dist.script_name = "setup.py"
dist.script_args = ["build_ext", "--inplace", "--force"]
dist.parse_command_line()
dist.run_commands()
'
if ! CC="$cc" CFLAGS="$flags" LDFLAGS="$flags" "$python" -c "$build_ext" >"$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log"
  echo "sanitize.sh: the build failed (the last lines of its output are above)"
  exit 1
fi
for name in _notify _cucalls _hostword _hotpath; do
  so=$(ls aiocudasem/"$name".*.so)
  if ! grep -q -a __asan_init "$so" || ! grep -q -a __ubsan_handle "$so"; then
    echo "sanitize.sh: $so was not built with both sanitizers"
    exit 1
  fi
done

export LD_PRELOAD=$libasan
export PYTHONMALLOC=malloc
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:log_path=$work/reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$work/reports/ubsan"
# The tests' children put the root first on PYTHONPATH; the copy's root is this directory.
imported=$("$python" -c 'import aiocudasem._hotpath as m; print(m.__file__)')
case "$imported" in
  "$tree"/aiocudasem/*) ;;
  *)
    echo "sanitize.sh: aiocudasem._hotpath was imported from $imported, not from the copy"
    exit 1
    ;;
esac

named=0
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then
    named=1
  fi
done
if [ "$named" -eq 0 ]; then
  set -- "${SANITIZE_TESTS[@]}" -m "not gpu" "$@"
fi
echo "== pytest under the sanitizers: $*"
start=$SECONDS
status=0
# --capture=sys: a report is written to fd 2, which pytest's default capture would take into a
# temporary file that is lost when the report halts the process.
"$python" -m pytest -p no:cacheprovider --capture=sys "$@" 2>&1 | tee "$work/pytest.log" ||
  status=$?
echo "== pytest ended with $status after $((SECONDS - start)) s"

found=0
reports=("$work"/reports/*)
if [ -e "${reports[0]}" ]; then
  for report in "${reports[@]}"; do
    echo "---- $(basename "$report")"
    cat "$report"
  done
  found=${#reports[@]}
fi
pattern='runtime error:|ERROR: (Address|UndefinedBehavior)Sanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer'
if grep -q -E "$pattern" "$work/pytest.log"; then
  echo "---- in pytest's output"
  grep -E -A 12 "$pattern" "$work/pytest.log"
  found=$((found + $(grep -c -E 'runtime error:|ERROR: AddressSanitizer' "$work/pytest.log")))
fi
if [ "$found" -ne 0 ]; then
  echo "sanitize.sh: $found sanitizer report(s) (above)"
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "sanitize.sh: pytest failed under the sanitizers (no sanitizer report was written)"
  exit "$status"
fi
echo "sanitize.sh: no sanitizer report"
