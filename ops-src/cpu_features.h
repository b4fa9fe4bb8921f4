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
#define CPU_HAS(glibc_name, gcc_name) CPU_FEATURE_ACTIVE(glibc_name)
#else
#define CPU_HAS(glibc_name, gcc_name) (__builtin_cpu_init(), __builtin_cpu_supports(gcc_name))
#endif

#endif
