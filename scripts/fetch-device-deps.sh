#!/usr/bin/env bash
# Fetch what the GPU machine lacks (it has no network) into .device/: cp312 wheels of the
# pinned cuda-bindings and of the test dependencies it does not have (aiohttp and its
# dependencies for the web-service example), and Debian's Vulkan loader with the GL
# vendor-neutral dispatch libraries that NVIDIA's Vulkan driver (ICD) links against.
# Without those, vkCreateInstance fails with VK_ERROR_INCOMPATIBLE_DRIVER.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .device/whl .device/gl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .device/whl \
  cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 anyio==4.16.0 trio==0.35.0 outcome sniffio \
  pytest-asyncio==1.5.0 \
  aiohttp==3.14.5 aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
mkdir -p /tmp/amd64/partial
apt-get $o update -qq
pkgs="libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2"
(cd .device/gl && rm -f ./*.deb && apt-get $o download -qq $pkgs)
for p in $pkgs; do
  ls .device/gl/"${p}"_*.deb >/dev/null 2>&1 || { echo "missing $p in .device/gl" >&2; exit 1; }
done
echo "fetched: $(ls .device/whl | wc -l) wheels, $(ls .device/gl | wc -l) packages in .device/"
