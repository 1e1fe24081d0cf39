#!/usr/bin/env bash
# Builds the documentation site into site/ with `mkdocs build --strict`: a broken link, a missing
# anchor or an API reference entry that does not resolve fails the build.
#
# The toolchain lives in its own virtualenv, .venv-docs, with the exact versions of
# docs/requirements.txt (made again when that file changes). The package is neither built nor
# installed: the API reference reads its source statically, so no CUDA and no C compiler are
# needed. Arguments go to `mkdocs build` (for example --quiet).
set -eu -o pipefail
cd "$(dirname "$0")/.."

venv=.venv-docs
stamp="$venv/requirements.txt"
if [ ! -x "$venv/bin/mkdocs" ] || ! cmp -s docs/requirements.txt "$stamp"; then
  echo "docs: installing docs/requirements.txt into $venv"
  "${PYTHON:-python3}" -m venv --clear "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r docs/requirements.txt
  cp docs/requirements.txt "$stamp"
fi

# Material for MkDocs prints a banner about its future on every build; the build's own
# warnings are what matter here.
NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --site-dir site "$@"
echo "docs: site/ built in ${SECONDS}s"
