#!/usr/bin/env bash
# Fetch what the GPU machine lacks (it has no network) into .device/: cp312 wheels of the
# pinned cuda-bindings and of the test dependencies it does not have, and Debian's Vulkan loader.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .device/whl .device/gl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .device/whl \
  cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 anyio==4.16.0 trio==0.35.0 outcome sniffio \
  pytest-asyncio==1.5.0
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
mkdir -p /tmp/amd64/partial
apt-get $o update -qq
(cd .device/gl && apt-get $o download -qq libvulkan1)
