/* runtime/dtype.c - the one table of dtypes opjit knows by name.
 *
 * Schemas (opjit_require's "float32|float64"), call errors, and the opjit
 * command's .npy reader and writer all name dtypes through it, so a dtype
 * added here is known everywhere at once. */
#include <stdio.h>
#include <string.h>

#include "opjit_admin.h"
#include "runtime/runtime.h"

static const struct {
    const char *name;
    uint8_t code, bits;
} dtype_table[] = {
    {"float32", kDLFloat, 32}, {"float64", kDLFloat, 64},  {"float16", kDLFloat, 16},
    {"bfloat16", kDLBfloat, 16}, {"int8", kDLInt, 8},      {"int16", kDLInt, 16},
    {"int32", kDLInt, 32},     {"int64", kDLInt, 64},      {"uint8", kDLUInt, 8},
    {"uint16", kDLUInt, 16},   {"uint32", kDLUInt, 32},    {"uint64", kDLUInt, 64},
    {"bool", OPJIT_DL_BOOL, 8},
};
#define DTYPE_COUNT ((int)(sizeof dtype_table / sizeof dtype_table[0]))

const char *opjit_dtype_at(int i, DLDataType *dtype)
{
    if (i < 0 || i >= DTYPE_COUNT)
        return NULL;
    if (dtype) {
        dtype->code = dtype_table[i].code;
        dtype->bits = dtype_table[i].bits;
        dtype->lanes = 1;
    }
    return dtype_table[i].name;
}

int opjit_dtype_parse(const char *name, DLDataType *dtype)
{
    for (int i = 0; name && i < DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_table[i].name)) {
            opjit_dtype_at(i, dtype);
            return OPJIT_OK;
        }
    return OPJIT_EINVAL;
}

const char *opjit_dtype_name(DLDataType dtype)
{
    for (int i = 0; dtype.lanes == 1 && i < DTYPE_COUNT; i++)
        if (dtype.code == dtype_table[i].code && dtype.bits == dtype_table[i].bits)
            return dtype_table[i].name;
    return NULL;
}

/* The runtime's own spellings (runtime/runtime.h). */
int dtype_parse(const char *s, DLDataType *out) { return opjit_dtype_parse(s, out) == OPJIT_OK; }

const char *dtype_name(DLDataType t, char *buf, size_t n)
{
    const char *name = opjit_dtype_name(t);
    if (name)
        return name;
    snprintf(buf, n, "dtype(code=%u, bits=%u, lanes=%u)", t.code, t.bits, t.lanes);
    return buf;
}
