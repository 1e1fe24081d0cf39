#!/usr/bin/env bash
# Quick start 1: the demo pipeline, on the real GPU if there is one, else on the simulated
# device (it says which). Extra arguments go to `python -m aiocudasem demo`.
. "$(dirname "$0")/_env.sh"
python -m pip install -q --disable-pip-version-check -e .
python -m aiocudasem demo "$@"
