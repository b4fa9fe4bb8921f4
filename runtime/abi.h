/*
 * runtime/abi.h - the size-first structs of the host API (opjit.h,
 * "Structs that grow"). The host's struct and ours may differ in size
 * either way; only the prefix both know crosses, in the manner of Linux's
 * copy_struct_from_user for clone3/openat2.
 */
#ifndef OPJIT_ABI_H
#define OPJIT_ABI_H

#include <stddef.h>
#include <string.h>

#include "opjit_admin.h"

/* Where field of type ends: the size of the first version of a struct
 * whose last field then was field. */
#define ABI_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* The first version of each struct: what a host must pass at least. */
#define ABI_MIN_CONFIG ABI_END(opjit_config, remote_push)
#define ABI_MIN_LOAD_INFO ABI_END(opjit_load_info, origin)
#define ABI_MIN_OP_INFO ABI_END(opjit_op_info, tier)
#define ABI_MIN_ARG_INFO ABI_END(opjit_arg_info, default_text)
#define ABI_MIN_WARM_OPTIONS ABI_END(opjit_warm_options, remote)
#define ABI_MIN_WARM_RESULT ABI_END(opjit_warm_result, seconds)
#define ABI_MIN_CACHE_INFO ABI_END(opjit_cache_info, tmp_dirs)
#define ABI_MIN_PRUNE_RESULT ABI_END(opjit_cache_prune_result, bytes_after)
#define ABI_MIN_REMOTE_INFO ABI_END(opjit_cache_remote_info, policy)

/* No struct of this API comes near this: a larger size was never set. */
#define ABI_MAX_SIZE 65536

/* The size a host's struct declares (its first member). */
static inline size_t abi_size(const void *host)
{
    return *(const size_t *)host;
}

/* Take the host's input struct `in` into `ours` (our_size bytes, defaults
 * already in it): the prefix both know is copied, ours->size stays
 * our_size. OPJIT_EINVAL (what in err) when in's size is below min or
 * past ABI_MAX_SIZE, or above ours with a byte this library does not know set (the host asks
 * for what this version cannot do). */
int abi_in(void *ours, size_t our_size, const void *in, size_t min, const char *what,
           char *err, size_t errlen);

/* Whether size can be a host's sizeof: at least the first version's
 * (min), and not past ABI_MAX_SIZE (a size never set holds whatever the
 * stack held: nothing is read or written by it). */
static inline int abi_size_fits(size_t size, size_t min)
{
    return size >= min && size <= ABI_MAX_SIZE;
}

/* Whether the host's output struct can be filled: OPJIT_OK, or
 * OPJIT_EINVAL (why in err) when its size does not fit. */
int abi_out_check(const void *out, size_t min, const char *what, char *err, size_t errlen);

/* abi_out_check's refusal with the message on rt, prefixed by the
 * function fn: OPJIT_EINVAL. */
int abi_out_refuse(const opjit_runtime *rt, const char *fn, const void *out, size_t min,
                   const char *what);

/* abi_out_check with the message on rt, prefixed by the function fn. */
static inline int abi_out_check_rt(const opjit_runtime *rt, const char *fn, const void *out,
                                   size_t min, const char *what)
{
    return abi_size_fits(abi_size(out), min) ? OPJIT_OK
                                             : abi_out_refuse(rt, fn, out, min, what);
}

/* Hand ours (our_size bytes) to the host's output struct out, checked by
 * abi_out_check: the prefix both know; out's bytes past ours are left as
 * the host set them (never written: a wrong size must not reach past the
 * host's struct) and its size stays the host's. */
static inline void abi_out(void *out, const void *ours, size_t our_size)
{
    size_t size = abi_size(out);
    size_t n = size < our_size ? size : our_size;
    memcpy((char *)out + sizeof(size_t), (const char *)ours + sizeof(size_t),
           n - sizeof(size_t));
}

/* The host's config (NULL: the defaults) as this library's struct, the
 * fields the host's header does not have at their defaults
 * (runtime/lifetime.c). OPJIT_EINVAL as for abi_in. */
int config_from_host(const opjit_config *host, opjit_config *cfg, char *err, size_t errlen);

#endif
