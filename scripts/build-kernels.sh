#!/usr/bin/env bash
# Rebuild aiocudasem/_workloads/kernels/kernels.fatbin from kernels.cu (needs nvcc, CUDA 12.8 or later for
# sm_120). Run it after changing kernels.cu and commit both; tests/test_kernels.py checks that
# kernels.sha256 matches the source.
set -eu -o pipefail
cd "$(dirname "$0")/../aiocudasem/_workloads/kernels"
archs="75 80 86 89 90 100 120"
gencode=()
for a in $archs; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
# PTX for the newest architecture, so that later GPUs can JIT it.
gencode+=(-gencode "arch=compute_120,code=compute_120")
nvcc -fatbin -O3 "${gencode[@]}" -o kernels.fatbin kernels.cu
sha256sum kernels.cu | cut -d' ' -f1 > kernels.sha256
echo "built kernels.fatbin ($(stat -c %s kernels.fatbin) bytes) for sm_${archs// /, sm_} + PTX"
