/*
 * ops-src/cpu_features.h - whether this CPU and its OS run an instruction
 * set, for the optimizing tier's kernels (gcc; libtcc never includes it). A
 * local header: the cache keys of the ops that include it hold it.
 *
 * CPU_HAS(glibc name, gcc name): glibc (2.33 and later) answers from what
 * its loader found when the process started. The fallback, libgcc's
 * __builtin_cpu_supports, links into the artifact a constructor that asks
 * CPUID about a dozen times each time the artifact is loaded, whether a
 * kernel runs or not (each a trap to the hypervisor on a VM).
 */
#ifndef CPU_FEATURES_H
#define CPU_FEATURES_H

#if defined(__has_include) && __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>
/* CPU_FEATURE_ACTIVE's test in unsigned arithmetic: glibc's shifts an int
 * 1 by 31 for a register's last bit (AVX512VL), which is undefined. */
static inline int cpu_active(unsigned index)
{
    const struct cpuid_feature *f = __x86_get_cpuid_feature_leaf(index / 128);
    return f->active_array[index % 128 / 32] >> index % 32 & 1;
}
#define CPU_HAS(glibc_name, gcc_name) cpu_active(x86_cpu_##glibc_name)
#else
#define CPU_HAS(glibc_name, gcc_name) (__builtin_cpu_init(), __builtin_cpu_supports(gcc_name))
#endif

#endif
