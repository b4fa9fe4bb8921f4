/*
 * tools/print.c - tensors as text, the way numpy prints them: the shortest
 * digits that read back as the same value at the tensor's precision,
 * decimal points aligned, rows wrapped at 75 columns. And names from disk
 * made safe to print.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

#define PRINT_MAX_ELEMENTS 1000
#define PRINT_LINE_WIDTH 75
#define ELEM_TEXT 64

/* "(2, 3)", "(3,)", "()" */
void cli_format_shape(char *buf, size_t len, const DLTensor *t)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "(");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "%s)", t->ndim == 1 ? "," : "");
}

const char *cli_dtype_name(DLDataType dt, char *buf, size_t len)
{
    const char *n = opjit_dtype_name(dt);
    if (n)
        return n;
    snprintf(buf, len, "dtype(code=%d, bits=%d, lanes=%d)", dt.code, dt.bits, dt.lanes);
    return buf;
}

int cli_host_tensor(const DLTensor *t)
{
    return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

/* ---- 16-bit floats ---- */

static float half_to_float(uint16_t h)
{
    unsigned exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f;
    if (exp == 0)
        f = ldexpf((float)mant, -24);
    else if (exp == 31)
        f = mant ? NAN : INFINITY;
    else
        f = ldexpf((float)(mant | 0x400), (int)exp - 25);
    return (h & 0x8000) ? -f : f;
}

/* float -> IEEE half, rounding to nearest even (finite values). */
static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    int shift = exp > 0 ? 13 : 14 - exp; /* subnormal: the implicit 1 shifts in */
    if (shift > 24)
        return (uint16_t)sign;
    uint32_t m = exp > 0 ? mant : mant | 0x800000;
    uint32_t h = (exp > 0 ? (uint32_t)exp << 10 : 0) | (m >> shift);
    uint32_t rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1)))
        h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---- one element ---- */

/* Precisions a float is printed at. */
enum { P_F64, P_F32, P_F16, P_BF16 };

static int same_at(double a, double b, int prec)
{
    switch (prec) {
    case P_F32: return (float)a == (float)b;
    case P_F16: return float_to_half((float)a) == float_to_half((float)b);
    case P_BF16: return float_to_bf16((float)a) == float_to_bf16((float)b);
    default: return a == b;
    }
}

/* Shortest text that reads back as v at precision prec: positional for
 * 1e-4 <= |v| < 1e16, else scientific, as numpy prints. */
static void format_float(char *buf, size_t len, double v, int prec)
{
    static const int max_digits[] = {17, 9, 5, 4};
    if (isnan(v) || isinf(v)) {
        snprintf(buf, len, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    int maxp = max_digits[prec], p;
    char sci[32];
    for (p = 1; p <= maxp; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, v);
        if (same_at(strtod(sci, NULL), v, prec))
            break;
    }
    if (p > maxp)
        p = maxp;
    double a = fabs(v);
    if (v == 0 || (a >= 1e-4 && a < 1e16)) {
        int exp10 = atoi(strchr(sci, 'e') + 1);
        int decimals = p - 1 - exp10;
        snprintf(buf, len, "%.*f", decimals > 0 ? decimals : 0, v);
        /* numpy marks a float that prints like an integer: "2." */
        if (!strchr(buf, '.') && strlen(buf) + 1 < len)
            strcat(buf, ".");
    } else {
        snprintf(buf, len, "%s", sci);
    }
}

/* Pointer to element k (in C order) of t. */
static const unsigned char *elem_ptr(const DLTensor *t, int64_t k)
{
    size_t itemsize = (size_t)(t->dtype.bits / 8);
    const unsigned char *base = (const unsigned char *)t->data + t->byte_offset;
    if (!t->strides)
        return base + (size_t)k * itemsize;
    int64_t off = 0;
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t dim = t->shape[i] ? t->shape[i] : 1;
        off += (k % dim) * t->strides[i];
        k /= dim;
    }
    return base + off * (int64_t)itemsize;
}

/* An element of a float tensor (float16/32/64, bfloat16). */
static void format_float_elem(char *buf, size_t len, DLDataType dt, const unsigned char *p)
{
    uint16_t h;
    float f;
    double d;
    if (dt.bits == 64) {
        memcpy(&d, p, sizeof d);
        format_float(buf, len, d, P_F64);
    } else if (dt.bits == 32) {
        memcpy(&f, p, sizeof f);
        format_float(buf, len, f, P_F32);
    } else {
        memcpy(&h, p, sizeof h);
        int bf = dt.code == kDLBfloat;
        format_float(buf, len, bf ? bf16_to_float(h) : half_to_float(h), bf ? P_BF16 : P_F16);
    }
}

static void format_elem(char *buf, size_t len, const DLTensor *t, int64_t k)
{
    const unsigned char *p = elem_ptr(t, k);
    DLDataType dt = t->dtype;
    int64_t v = 0;
    uint64_t u = 0;
    if (dt.code == kDLFloat || dt.code == kDLBfloat) {
        format_float_elem(buf, len, dt, p);
    } else if (dt.code == OPJIT_DL_BOOL) {
        snprintf(buf, len, "%s", *p ? "True" : "False");
    } else if (dt.code == kDLInt) {
        switch (dt.bits) {
        case 8: { int8_t x; memcpy(&x, p, 1); v = x; break; }
        case 16: { int16_t x; memcpy(&x, p, 2); v = x; break; }
        case 32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
        default: memcpy(&v, p, 8); break;
        }
        snprintf(buf, len, "%lld", (long long)v);
    } else {
        switch (dt.bits) {
        case 8: u = *p; break;
        case 16: { uint16_t x; memcpy(&x, p, 2); u = x; break; }
        case 32: { uint32_t x; memcpy(&x, p, 4); u = x; break; }
        default: memcpy(&u, p, 8); break;
        }
        snprintf(buf, len, "%llu", (unsigned long long)u);
    }
}

/* ---- the whole tensor ---- */

/* Pad positional floats so their decimal points line up, as numpy does:
 * "[ 1.    2.25 12.5 ]". Left alone when any is scientific, nan or inf. */
static void align_decimal_points(char (*text)[ELEM_TEXT], int64_t n)
{
    int ipart = 0, fpart = 0;
    for (int64_t k = 0; k < n; k++) {
        const char *dot = strchr(text[k], '.');
        if (!dot || strpbrk(text[k], "ein"))
            return;
        int i = (int)(dot - text[k]), fr = (int)strlen(dot + 1);
        ipart = i > ipart ? i : ipart;
        fpart = fr > fpart ? fr : fpart;
    }
    if (ipart + 1 + fpart >= ELEM_TEXT)
        return;
    for (int64_t k = 0; k < n; k++) {
        char tmp[ELEM_TEXT];
        const char *dot = strchr(text[k], '.');
        int i = (int)(dot - text[k]);
        snprintf(tmp, sizeof tmp, "%*s%s%*s", ipart - i, "", text[k],
                 fpart - (int)strlen(dot + 1), "");
        memcpy(text[k], tmp, sizeof tmp);
    }
}

typedef struct printer {
    FILE *f;
    char (*text)[ELEM_TEXT];
    int width;
    int64_t k;
    int col;
} printer;

static void print_rec(printer *pr, const DLTensor *t, int dim)
{
    fputc('[', pr->f);
    pr->col++;
    int64_t n = t->shape[dim];
    for (int64_t j = 0; j < n; j++) {
        if (dim == t->ndim - 1) {
            if (j > 0) {
                if (pr->col + 1 + pr->width + 1 > PRINT_LINE_WIDTH) {
                    fprintf(pr->f, "\n%*s", dim + 1, "");
                    pr->col = dim + 1;
                } else {
                    fputc(' ', pr->f);
                    pr->col++;
                }
            }
            pr->col += fprintf(pr->f, "%*s", pr->width, pr->text[pr->k++]);
        } else {
            if (j > 0) {
                for (int b = 0; b < t->ndim - dim - 1; b++)
                    fputc('\n', pr->f);
                fprintf(pr->f, "%*s", dim + 1, "");
                pr->col = dim + 1;
            }
            print_rec(pr, t, dim + 1);
        }
    }
    fputc(']', pr->f);
    pr->col++;
}

/* The element count of t, or PRINT_MAX_ELEMENTS + 1 when it is more. */
static int64_t print_count(const DLTensor *t)
{
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] > PRINT_MAX_ELEMENTS)
            return PRINT_MAX_ELEMENTS + 1;
        numel *= t->shape[i];
        if (numel > PRINT_MAX_ELEMENTS) {
            for (int j = i + 1; j < t->ndim; j++)
                if (t->shape[j] == 0)
                    return 0;
            return PRINT_MAX_ELEMENTS + 1;
        }
    }
    return numel;
}

/* The numel values of t, formatted, aligned and printed. */
static void print_values(FILE *f, const DLTensor *t, int64_t numel)
{
    char(*text)[ELEM_TEXT] = malloc((size_t)numel * sizeof *text);
    if (!text) {
        fprintf(f, "(out of memory)\n");
        return;
    }
    int width = 0;
    for (int64_t k = 0; k < numel; k++)
        format_elem(text[k], sizeof text[k], t, k);
    if (t->dtype.code == kDLFloat || t->dtype.code == kDLBfloat)
        align_decimal_points(text, numel);
    for (int64_t k = 0; k < numel; k++) {
        int w = (int)strlen(text[k]);
        width = w > width ? w : width;
    }
    if (t->ndim == 0) {
        fprintf(f, "%s\n", text[0]);
    } else {
        printer pr = {f, text, width, 0, 0};
        print_rec(&pr, t, 0);
        fputc('\n', f);
    }
    free(text);
}

void cli_print_tensor(FILE *f, const char *label, const DLTensor *t)
{
    char shape[64 * 24], dbuf[64];
    cli_format_shape(shape, sizeof shape, t);
    fprintf(f, "%s: shape %s, dtype %s\n", label, shape,
            cli_dtype_name(t->dtype, dbuf, sizeof dbuf));
    int64_t numel = print_count(t);
    if (!opjit_dtype_name(t->dtype))
        fprintf(f, "(this dtype cannot be printed)\n");
    else if (!cli_host_tensor(t))
        fprintf(f, "(on device %s; save it with --out FILE.npy)\n",
                opjit_device_name(OPJIT_CUDA) ? opjit_device_name(OPJIT_CUDA) : "?");
    else if (numel > PRINT_MAX_ELEMENTS)
        fprintf(f, "(more than %d elements: save it with --out FILE.npy)\n",
                PRINT_MAX_ELEMENTS);
    else if (numel == 0)
        fprintf(f, "[]\n");
    else
        print_values(f, t, numel);
}

/* ---- names from disk ---- */

/* The length of the valid UTF-8 sequence at p that is not a C1 control
 * (U+0080..U+009F, which terminals may obey like ESC [), else 0. */
static size_t utf8_printable(const unsigned char *p)
{
    size_t n = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    if (p[0] >= 0xf5)
        n = 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if (n == 2 && p[0] == 0xc2 && p[1] < 0xa0)
        return 0;
    if ((n == 3 && p[0] == 0xe0 && p[1] < 0xa0) || (n == 3 && p[0] == 0xed && p[1] >= 0xa0) ||
        (n == 4 && p[0] == 0xf0 && p[1] < 0x90) || (n == 4 && p[0] == 0xf4 && p[1] >= 0x90))
        return 0; /* overlong, a surrogate, or past U+10FFFF */
    return n;
}

const char *cli_escape(const char *s, int keep, char *buf, size_t len)
{
    static const char hexd[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t k = 0;
    if (!len)
        return buf;
    while (*p) {
        char piece[4];
        const char *out = piece;
        size_t n = *p >= 0x80 ? utf8_printable(p) : 0, used = n ? n : 1;
        unsigned ch = *p;
        if (n) {
            out = (const char *)p;
        } else if (((ch == '\n' || ch == '\t') && (keep & CLI_ESC_LINES)) ||
                   (ch == '\\' && (keep & CLI_ESC_BACKSLASH))) {
            piece[0] = (char)ch;
            n = 1;
        } else if (ch == '\\' || ch == '\n' || ch == '\t' || ch == '\r') {
            piece[0] = '\\';
            piece[1] = ch == '\\' ? '\\' : ch == '\n' ? 'n' : ch == '\t' ? 't' : 'r';
            n = 2;
        } else if (ch < 0x20 || ch >= 0x7f) {
            memcpy(piece, (char[]){'\\', 'x', hexd[ch >> 4], hexd[ch & 15]}, 4);
            n = 4;
        } else {
            piece[0] = (char)ch;
            n = 1;
        }
        if (k + n >= len)
            break; /* cut short, never in the middle of an escape */
        memcpy(buf + k, out, n);
        k += n;
        p += used;
    }
    buf[k] = '\0';
    return buf;
}

/* ---- JSON ---- */

void cli_json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    fputc('"', f);
    while (*p) {
        size_t n = *p >= 0x80 ? utf8_printable(p) : 0;
        if (n) {
            fwrite(p, 1, n, f);
            p += n;
            continue;
        }
        unsigned ch = *p++;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\u%04x", ch);
        else if (ch >= 0x80) /* not UTF-8, or a C1 control */
            fputs("\\ufffd", f);
        else
            fputc((int)ch, f);
    }
    fputc('"', f);
}

void cli_json_opt_str(FILE *f, const char *s)
{
    if (s)
        cli_json_str(f, s);
    else
        fputs("null", f);
}

/* Element k as a JSON value: numbers as format_elem writes them ("2." made
 * "2.0"), booleans as true/false, nan and infinities as null. */
static void json_elem(FILE *f, const DLTensor *t, int64_t k)
{
    char buf[ELEM_TEXT];
    format_elem(buf, sizeof buf, t, k);
    size_t n = strlen(buf);
    if (t->dtype.code == OPJIT_DL_BOOL)
        fputs(*elem_ptr(t, k) ? "true" : "false", f);
    else if (strpbrk(buf, "in")) /* nan, inf, -inf */
        fputs("null", f);
    else
        fprintf(f, "%s%s", buf, n && buf[n - 1] == '.' ? "0" : "");
}

static void json_values_rec(FILE *f, const DLTensor *t, int dim, int64_t *k)
{
    fputc('[', f);
    for (int64_t j = 0; j < t->shape[dim]; j++) {
        if (j)
            fputs(", ", f);
        if (dim == t->ndim - 1)
            json_elem(f, t, (*k)++);
        else
            json_values_rec(f, t, dim + 1, k);
    }
    fputc(']', f);
}

void cli_json_tensor_fields(FILE *f, const DLTensor *t, int values)
{
    char dbuf[64];
    fputs("\"shape\": [", f);
    for (int i = 0; i < t->ndim; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    fputs("], \"dtype\": ", f);
    cli_json_str(f, cli_dtype_name(t->dtype, dbuf, sizeof dbuf));
    fputs(", \"values\": ", f);
    int64_t numel = print_count(t), k = 0;
    if (!values || !opjit_dtype_name(t->dtype) || !cli_host_tensor(t) ||
        numel > PRINT_MAX_ELEMENTS)
        fputs("null", f);
    else if (t->ndim == 0)
        json_elem(f, t, 0);
    else
        json_values_rec(f, t, 0, &k);
}
