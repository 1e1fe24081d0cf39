// The demo, test and benchmark workloads of aiocudasem's CUDA driver.
// %globaltimer gives exact device durations; the frame check reads the producer's pinned buffer
// through volatile loads so that it sees the host's writes.
//
// Built into kernels.fatbin by scripts/build-kernels.sh (nvcc), with the package's include/
// directory on the include path; kernels.sha256 records which source (this file and the header it
// includes) the fatbin was built from, and a test checks that it is this one.
#include <aiocudasem/progress.cuh>

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

// A persistent kernel that reports progress: publishes start + 1 to start + count into a host
// timeline's word, value i once ns * i / count nanoseconds of device time have passed, through
// the package's own aiocudasem_publish(). With `stamps`, it first writes the %globaltimer of each
// publish to stamps[i - 1]. It traps instead of publishing `trap_at` (0: never).
extern "C" __global__ void aiocudasem_progress(unsigned long long *word, unsigned long long start,
                                               unsigned int count, unsigned long long ns,
                                               unsigned long long trap_at,
                                               unsigned long long *stamps) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (unsigned int i = 1; i <= count; ++i) {
        unsigned long long due = ns / count * i + ns % count * i / count;
        do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t - t0 < due);
        if (start + i == trap_at) __trap();
        if (stamps) stamps[i - 1] = t;
        aiocudasem_publish(word, start + i);
    }
}
