/* runtime/abi.c - the size-first structs at the host API's boundary. */
#include <stdio.h>
#include <string.h>

#include "runtime/abi.h"
#include "runtime/runtime.h"

/* OPJIT_OK when size can be a host's sizeof: at least the first version's
 * (min), and not past ABI_MAX_SIZE (a size never set holds whatever the
 * stack held: nothing is read or written by it). */
static int abi_size_ok(size_t size, size_t min, const char *what, char *err, size_t errlen)
{
    if (size >= min && size <= ABI_MAX_SIZE)
        return OPJIT_OK;
    snprintf(err, errlen, "%s.size is %zu, %s %s (%zu bytes): set it to sizeof the struct", what,
             size, size < min ? "below the smallest" : "far past any", what,
             size < min ? min : (size_t)ABI_MAX_SIZE);
    return OPJIT_EINVAL;
}

int abi_in(void *ours, size_t our_size, const void *in, size_t min, const char *what,
           char *err, size_t errlen)
{
    size_t size = abi_size(in);
    if (abi_size_ok(size, min, what, err, errlen))
        return OPJIT_EINVAL;
    const unsigned char *bytes = in;
    for (size_t i = our_size; i < size; i++)
        if (bytes[i]) {
            snprintf(err, errlen,
                     "%s: byte %zu is set, and this library (%s) knows only %zu bytes of it",
                     what, i, opjit_version_string(), our_size);
            return OPJIT_EINVAL;
        }
    size_t n = size < our_size ? size : our_size;
    memcpy((char *)ours + sizeof(size_t), bytes + sizeof(size_t), n - sizeof(size_t));
    return OPJIT_OK;
}

int abi_out_check(const void *out, size_t min, const char *what, char *err, size_t errlen)
{
    return abi_size_ok(abi_size(out), min, what, err, errlen);
}

int abi_out_check_rt(const opjit_runtime *rt, const char *fn, const void *out, size_t min,
                     const char *what)
{
    char err[256];
    int rc = abi_out_check(out, min, what, err, sizeof err);
    return rc ? rt_error(rt, rc, "%s: %s", fn, err) : OPJIT_OK;
}

void abi_out(void *out, const void *ours, size_t our_size)
{
    size_t size = abi_size(out);
    size_t n = size < our_size ? size : our_size;
    memcpy((char *)out + sizeof(size_t), (const char *)ours + sizeof(size_t),
           n - sizeof(size_t));
}
