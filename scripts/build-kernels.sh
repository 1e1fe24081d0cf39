#!/usr/bin/env bash
# Rebuild aiocudasem/_workloads/kernels/kernels.fatbin from kernels.cu and the header it includes,
# aiocudasem/include/aiocudasem/progress.cuh (needs nvcc, CUDA 12.8 or later for sm_120). Run it
# after changing either and commit them together; tests/test_kernels.py checks that
# kernels.sha256 matches the source.
set -eu -o pipefail
cd "$(dirname "$0")/../aiocudasem/_workloads/kernels"
archs="75 80 86 89 90 100 120"
gencode=()
for a in $archs; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
# PTX for the newest architecture, so that later GPUs can JIT it.
gencode+=(-gencode "arch=compute_120,code=compute_120")
include=../../include
nvcc -fatbin -O3 -I "$include" "${gencode[@]}" -o kernels.fatbin kernels.cu
cat kernels.cu "$include/aiocudasem/progress.cuh" | sha256sum | cut -d' ' -f1 > kernels.sha256
echo "built kernels.fatbin ($(stat -c %s kernels.fatbin) bytes) for sm_${archs// /, sm_} + PTX"
