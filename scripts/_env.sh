# Sourced by demo.sh and test.sh: a project virtualenv in .venv with the package installed.
set -eu -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip
