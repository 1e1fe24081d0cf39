#!/usr/bin/env bash
# Quick start 1: the demo pipeline, on the real GPU if there is one, else on the simulated
# device (it says which). Extra arguments go to `python -m aiocudasem demo`.
. "$(dirname "$0")/_env.sh"
# -qq: setuptools prints an information-only notice on every editable install of this layout.
python -m pip install -qq --disable-pip-version-check -e .
python -m aiocudasem demo "$@"
