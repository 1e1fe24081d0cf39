#!/usr/bin/env bash
# Quick start 2: the test command. Lint (ruff), types (mypy --strict), then the CPU suite on
# asyncio, asyncio+uvloop and trio. The GPU suite is `bash scripts/device.sh` on a GPU machine.
. "$(dirname "$0")/_env.sh"
# The Vulkan struct-layout test compiles against Debian's vulkan_core.h.
if [ ! -f /usr/include/vulkan/vulkan_core.h ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing libvulkan-dev for the Vulkan layout test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvulkan-dev) >/dev/null \
    || echo "could not install libvulkan-dev: the layout test will skip and say so"
fi
python -m pip install -q --disable-pip-version-check -e '.[test]'
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy --strict"
mypy
echo "== pytest (CPU suite)"
python -m pytest -m "not gpu" "$@"
