/* runtime/abi.c - the size-first structs at the host API's boundary. */
#include <stdio.h>
#include <string.h>

#include "runtime/abi.h"
#include "runtime/runtime.h"

/* OPJIT_OK when size fits (abi_size_fits), else OPJIT_EINVAL and why. */
static int abi_size_ok(size_t size, size_t min, const char *what, char *err, size_t errlen)
{
    if (abi_size_fits(size, min))
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

int abi_out_refuse(const opjit_runtime *rt, const char *fn, const void *out, size_t min,
                   const char *what)
{
    char err[256] = "";
    int rc = abi_out_check(out, min, what, err, sizeof err);
    return rt_error(rt, rc ? rc : OPJIT_EINVAL, "%s: %s", fn, err);
}
