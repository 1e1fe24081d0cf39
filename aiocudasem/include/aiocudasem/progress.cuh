// Progress from inside a running kernel, published into a host timeline.
//
// A kernel that is given a host timeline's device address (HostTimeline.handle, a 64-bit word
// in page-locked host memory) publishes values into it; the host awaits each value with
// `await timeline.wait_value(n)` while the kernel still runs, and no host thread polls. Pass
// aiocudasem.lowlevel.include_dir() to nvcc or NVRTC as an include path (-I) and
// `#include <aiocudasem/progress.cuh>`. docs/progress.md has the rules and examples.
//
// - aiocudasem_publish(word, value): one writer at a time (say thread 0 of block 0, or one
//   thread per step that the kernel orders), with increasing values. A system-scope release
//   store: what the kernel wrote before it is visible to whoever sees the value.
// - aiocudasem_publish_max(word, value): any number of threads and blocks at once. A
//   system-scope release atomic max: the word never goes back, whatever the order.
//
// Values are in [1, 2**63), as every host timeline's. Host signals (HostTimeline.signal) and
// device publishes must not mix on one timeline while the kernel runs: a device atomic on host
// memory is not atomic with respect to the host. Keep the timeline open until the kernel has
// completed; its release does not know about the kernel.
//
// Any 64-bit unsigned integer type will do for the word: uint64_t, unsigned long long, or
// cuda::std::uint64_t. The header needs no other header, so NVRTC compiles it as it is.
#ifndef AIOCUDASEM_PROGRESS_CUH
#define AIOCUDASEM_PROGRESS_CUH

namespace aiocudasem_detail {

template <typename Word>
__device__ __forceinline__ unsigned long long *word_address(Word *word) {
    static_assert(sizeof(Word) == 8 && Word(0) < Word(-1),
                  "a host timeline's word is a 64-bit unsigned integer");
    return reinterpret_cast<unsigned long long *>(word);
}

// A volatile word: the stores below are what makes each publish visible, not its type.
template <typename Word>
__device__ __forceinline__ unsigned long long *word_address(volatile Word *word) {
    return word_address(const_cast<Word *>(word));
}

}  // namespace aiocudasem_detail

// Publish `value` into the host timeline's word: a system-scope release store. One writer at a
// time, with increasing values (aiocudasem_publish_max otherwise).
template <typename Word>
__device__ __forceinline__ void aiocudasem_publish(Word *word, unsigned long long value) {
    unsigned long long *p = aiocudasem_detail::word_address(word);
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    asm volatile("st.release.sys.u64 [%0], %1;" : : "l"(p), "l"(value) : "memory");
#else
    __threadfence_system();
    *reinterpret_cast<volatile unsigned long long *>(p) = value;
#endif
}

// Publish `value` unless the word holds a higher one already: a system-scope release atomic
// max, for any number of writers.
template <typename Word>
__device__ __forceinline__ void aiocudasem_publish_max(Word *word, unsigned long long value) {
    unsigned long long *p = aiocudasem_detail::word_address(word);
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    unsigned long long old;
    asm volatile("atom.release.sys.max.u64 %0, [%1], %2;"
                 : "=l"(old)
                 : "l"(p), "l"(value)
                 : "memory");
    (void)old;
#else
    __threadfence_system();
    atomicMax_system(p, value);
#endif
}

#endif  // AIOCUDASEM_PROGRESS_CUH
