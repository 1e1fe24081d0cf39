// The demo, test and benchmark workloads of aiocudasem's CUDA driver.
// %globaltimer gives exact device durations; the frame check reads the producer's pinned buffer
// through volatile loads so that it sees the host's writes.
//
// Built into kernels.fatbin by scripts/build-kernels.sh (nvcc); kernels.sha256 records which
// source the fatbin was built from, and a test checks that it is this one.
extern "C" __global__ void aiocudasem_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" __global__ void aiocudasem_check_frame(const unsigned int *src, unsigned int words,
                                                  unsigned int frame, unsigned int *out) {
    unsigned int bad = 0;
    const volatile unsigned int *v = src;
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) {
        bad += v[i] != frame * 2654435761u + i;
    }
    // Thread 0 also adds the "seen" mark, so a frame checked twice or never shows.
    if (threadIdx.x == 0) bad += 0x10000u;
    if (bad) atomicAdd_system(out + frame, bad);
}

extern "C" __global__ void aiocudasem_trap() { __trap(); }
