/*
 * tools/opjit.c - the `opjit` command: global options, subcommand dispatch,
 * and the list, load and call subcommands.
 *
 *   opjit [--cache DIR] [--ops-path DIR] [-v] COMMAND [ARGS...]
 *
 * Exit status: 0 success, 1 a runtime failure (the message on stderr),
 * 2 a usage error.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "opjit.h"
#include "loader/loader.h"
#include "tools/commands.h"
#include "tools/npy.h"

/* ---- global options ------------------------------------------------------ */

static struct {
    const char *cache_dir;
    char *ops_path; /* --ops-path values joined with ':' (heap) */
    int verbose;
} g_opt;

const char opjit_cli_common_help[] =
    "  --cache DIR      the writable cache directory (default: $OPJIT_CACHE_DIR,\n"
    "                   else $XDG_CACHE_HOME/opjit, else ~/.cache/opjit)\n"
    "  --ops-path DIR   look for operator sources in DIR, before $OPJIT_OPS_PATH\n"
    "                   (repeatable; DIR may itself be a colon-separated list)\n"
    "  -v, --verbose    log what the runtime does to stderr (-vv: debug)\n"
    "  -q, --quiet      no warnings on stderr (errors are still reported)\n";

static void cli_log(void *ud, int level, const char *msg)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    (void)ud;
    const char *name = level >= 0 && level <= OPJIT_LOG_DEBUG ? names[level] : "log";
    fprintf(stderr, "opjit: %s: %s\n", name, msg);
}

void opjit_cli_config(opjit_config *cfg)
{
    opjit_config_init(cfg);
    if (g_opt.cache_dir)
        cfg->cache_dir = g_opt.cache_dir;
    if (g_opt.ops_path)
        cfg->ops_path = g_opt.ops_path;
    /* Warnings reach stderr unless -q: a cache that stopped caching, a
     * failed optimizing compile. */
    if (g_opt.verbose >= 0) {
        cfg->log = cli_log;
        cfg->log_ud = NULL;
        cfg->verbosity = g_opt.verbose >= 2   ? OPJIT_LOG_DEBUG
                         : g_opt.verbose == 1 ? OPJIT_LOG_INFO
                                              : OPJIT_LOG_WARN;
    }
}

int opjit_cli_create(opjit_runtime **rt)
{
    opjit_config cfg;
    opjit_cli_config(&cfg);
    int st = opjit_create(&cfg, rt);
    if (st != OPJIT_OK) {
        fprintf(stderr, "opjit: cannot create the runtime: %s (%s)\n", opjit_errstr(st),
                opjit_status_name(st));
        *rt = NULL;
        return OPJIT_EXIT_FAIL;
    }
    return OPJIT_EXIT_OK;
}

/* Matches "--name VALUE" and "--name=VALUE". 1: matched, *val set and *i
 * advanced past a separate value; 0: not this option; -1: value missing. */
static int opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "opjit: option %s needs a value\n", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int opjit_cli_common_option(int argc, char **argv, int *i)
{
    const char *a = argv[*i], *val;
    int r;
    if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
        g_opt.verbose++;
        (*i)++;
        return 1;
    }
    if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
        g_opt.verbose = -1;
        (*i)++;
        return 1;
    }
    if (strcmp(a, "-vv") == 0) {
        g_opt.verbose += 2;
        (*i)++;
        return 1;
    }
    if ((r = opt_value(argc, argv, i, "--cache", &val)) != 0) {
        if (r < 0)
            return OPJIT_EXIT_USAGE;
        if (!*val) {
            fprintf(stderr, "opjit: --cache needs a directory\n");
            return OPJIT_EXIT_USAGE;
        }
        g_opt.cache_dir = val;
        /* Subcommands that build their own config see it too. */
        setenv("OPJIT_CACHE_DIR", val, 1);
        (*i)++;
        return 1;
    }
    if ((r = opt_value(argc, argv, i, "--ops-path", &val)) != 0) {
        if (r < 0)
            return OPJIT_EXIT_USAGE;
        if (!*val) {
            fprintf(stderr, "opjit: --ops-path needs a directory\n");
            return OPJIT_EXIT_USAGE;
        }
        size_t old = g_opt.ops_path ? strlen(g_opt.ops_path) : 0;
        char *p = realloc(g_opt.ops_path, old + strlen(val) + 2);
        if (!p) {
            fprintf(stderr, "opjit: out of memory\n");
            return OPJIT_EXIT_USAGE;
        }
        if (old)
            p[old++] = ':';
        strcpy(p + old, val);
        g_opt.ops_path = p;
        (*i)++;
        return 1;
    }
    return 0;
}

/* The result of opjit_cli_common_option as the loop in a subcommand wants
 * it: 1 consumed, 0 not, -1 usage error already reported. */
static int common_opt(int argc, char **argv, int *i)
{
    int r = opjit_cli_common_option(argc, argv, i);
    if (r == OPJIT_EXIT_USAGE)
        return -1;
    if (r == 1)
        (*i)--; /* the caller's loop advances */
    return r;
}

static int is_help(const char *a)
{
    return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0;
}

static int usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "opjit: %s%s", cmd ? cmd : "", cmd ? ": " : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'opjit %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return OPJIT_EXIT_USAGE;
}

/* ---- small helpers --------------------------------------------------------- */

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b)
        return 0;
    if (strcmp(a, b) == 0)
        return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* "(2, 3)", "(3,)", "()" */
static void format_shape(char *buf, size_t len, const DLTensor *t)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "(");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "%s)", t->ndim == 1 ? "," : "");
}

static const char *dtype_name(DLDataType dt, char *buf, size_t len)
{
    const char *n = npy_dtype_name(dt);
    if (n)
        return n;
    snprintf(buf, len, "dtype(code=%d, bits=%d, lanes=%d)", dt.code, dt.bits, dt.lanes);
    return buf;
}

/* The runtime's message for a failure about `what` (a file, an op): the
 * message alone when it already names it. */
static void rt_error(opjit_runtime *rt, const char *what)
{
    const char *msg = rt ? opjit_errmsg(rt) : "";
    if (!msg || !*msg)
        fprintf(stderr, "opjit: %s: failed\n", what);
    else if (strstr(msg, what))
        fprintf(stderr, "opjit: %s\n", msg);
    else
        fprintf(stderr, "opjit: %s: %s\n", what, msg);
}

/* ---- list ---------------------------------------------------------------- */

static const char list_help[] =
    "usage: opjit list [--ops-path DIR] [options]\n"
    "\n"
    "Find every operator source (*.c, *.cu) on the search path and list the\n"
    "operators: schema, devices, the tier a load would get, the source of each\n"
    "device's kernel and its description. Each source is compiled and its init\n"
    "run in a child process with a time limit ($OPJIT_DISCOVER_TIMEOUT seconds,\n"
    "default 60): one that fails to compile, crashes, exits or hangs is reported\n"
    "on stderr and the others are still listed; the exit status is then 1.\n"
    "\n"
    "The search path: the --ops-path directories, then $OPJIT_OPS_PATH.\n"
    "\n"
    "options:\n";

typedef struct name_set {
    char **v;
    size_t n, cap;
} name_set;

static int name_set_add(name_set *s, const char *name, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->v[i]) == len && memcmp(s->v[i], name, len) == 0)
            return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    memcpy(copy, name, len);
    copy[len] = '\0';
    s->v[s->n++] = copy;
    return 0;
}

static void name_set_free(name_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* The op name of a source file name: "nms.c" -> "nms" (length), else 0. */
static size_t source_stem(const char *file)
{
    size_t n = strlen(file);
    if (file[0] == '.')
        return 0;
    if (n > 2 && strcmp(file + n - 2, ".c") == 0)
        return n - 2;
    if (n > 3 && strcmp(file + n - 3, ".cu") == 0)
        return n - 3;
    return 0;
}

/* Add the op names of the sources in each directory of the colon-separated
 * path. explicit: a directory that cannot be read is an error. */
static int scan_path(const char *path, int explicit, name_set *names)
{
    int fail = 0;
    if (!path)
        return 0;
    const char *p = path;
    while (*p) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0) {
            char *dir = malloc(len + 1);
            if (!dir)
                return -1;
            memcpy(dir, p, len);
            dir[len] = '\0';
            DIR *d = opendir(dir);
            if (!d) {
                if (explicit) {
                    fprintf(stderr, "opjit: --ops-path %s: %s\n", dir, strerror(errno));
                    fail = 1;
                }
            } else {
                struct dirent *e;
                while ((e = readdir(d)) != NULL) {
                    size_t stem = source_stem(e->d_name);
                    if (stem == 0)
                        continue;
                    size_t flen = len + 1 + strlen(e->d_name) + 1;
                    char *file = malloc(flen);
                    struct stat st;
                    if (!file) {
                        fail = -1;
                        break;
                    }
                    snprintf(file, flen, "%s/%s", dir, e->d_name);
                    int regular = stat(file, &st) == 0 && S_ISREG(st.st_mode);
                    free(file);
                    if (regular && name_set_add(names, e->d_name, stem) != 0) {
                        fail = -1;
                        break;
                    }
                }
                closedir(d);
            }
            free(dir);
            if (fail < 0)
                return -1;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return fail;
}

typedef struct op_vec {
    const opjit_op **v;
    size_t n, cap;
} op_vec;

static int collect_op(void *ud, const opjit_op *op)
{
    op_vec *ops = ud;
    if (ops->n == ops->cap) {
        size_t cap = ops->cap ? ops->cap * 2 : 16;
        const opjit_op **v = realloc(ops->v, cap * sizeof *v);
        if (!v)
            return 1;
        ops->v = v;
        ops->cap = cap;
    }
    ops->v[ops->n++] = op;
    return 0;
}

/* What `opjit list` prints: one row per (op, source). */
typedef struct listed_op {
    char *name, *schema, *path, *doc;
    const char *tier;
    int device;
} listed_op;

typedef struct listed_ops {
    listed_op *v;
    size_t n, cap;
    int sources, oom;
} listed_ops;

static int listed_add(listed_ops *ops, const opjit_source_ops *src, int i)
{
    if (ops->n == ops->cap) {
        size_t cap = ops->cap ? ops->cap * 2 : 16;
        listed_op *v = realloc(ops->v, cap * sizeof *v);
        if (!v)
            return -1;
        ops->v = v;
        ops->cap = cap;
    }
    const char *schema = src->schemas[i], *paren = strchr(schema, '(');
    listed_op *o = &ops->v[ops->n];
    o->name = strndup(schema, paren ? (size_t)(paren - schema) : strlen(schema));
    o->schema = strdup(schema);
    o->path = strdup(src->path);
    o->doc = strdup(src->docs[i]);
    o->tier = src->tier;
    o->device = src->device;
    ops->n++;
    return o->name && o->schema && o->path && o->doc ? 0 : -1;
}

static int collect_source(void *ud, const opjit_source_ops *src)
{
    listed_ops *ops = ud;
    ops->sources++;
    if (src->status == OPJIT_EDEVICE) { /* no CUDA here: not an error */
        if (g_opt.verbose > 0)
            fprintf(stderr, "opjit: %s\n", src->error);
    } else if (src->status != OPJIT_OK)
        fprintf(stderr, "opjit: %s\n", src->error);
    for (int i = 0; i < src->nops && !ops->oom; i++)
        if (listed_add(ops, src, i) != 0)
            ops->oom = 1;
    return 0;
}

static int cmp_listed(const void *pa, const void *pb)
{
    const listed_op *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    return c ? c : a->device - b->device;
}

static void listed_free(listed_ops *ops)
{
    for (size_t i = 0; i < ops->n; i++) {
        free(ops->v[i].name);
        free(ops->v[i].schema);
        free(ops->v[i].path);
        free(ops->v[i].doc);
    }
    free(ops->v);
}

int opjit_cmd_list(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("%s%s", list_help, opjit_cli_common_help);
            return OPJIT_EXIT_OK;
        }
        int r = common_opt(argc, argv, &i);
        if (r < 0)
            return OPJIT_EXIT_USAGE;
        if (r == 0)
            return usage_error("list", "unexpected argument '%s'", argv[i]);
    }

    opjit_runtime *rt;
    if (opjit_cli_create(&rt) != OPJIT_EXIT_OK)
        return OPJIT_EXIT_FAIL;
    /* The --ops-path directories must exist. */
    name_set ignored = {0};
    int r1 = scan_path(g_opt.ops_path, 1, &ignored);
    name_set_free(&ignored);
    if (r1 < 0) {
        fprintf(stderr, "opjit: out of memory\n");
        opjit_destroy(rt);
        return OPJIT_EXIT_FAIL;
    }
    /* Every source is loaded in a child process: one that crashes, exits
     * or hangs is reported and the others are still listed. */
    listed_ops ops = {0};
    int st = opjit_discover(rt, collect_source, &ops);
    int fail = r1 || (st != OPJIT_OK && st != OPJIT_EDEVICE) || ops.oom;
    if (ops.n > 1)
        qsort(ops.v, ops.n, sizeof *ops.v, cmp_listed);
    for (size_t i = 0; i < ops.n; i++) {
        if (i == 0 || strcmp(ops.v[i].name, ops.v[i - 1].name)) {
            printf("%s%s\n", i ? "\n" : "", ops.v[i].schema);
        }
        char where[64];
        snprintf(where, sizeof where, "%s/%s", opjit_device_name(ops.v[i].device),
                 ops.v[i].tier);
        if (*ops.v[i].doc)
            printf("    %-9s %s  %s\n", where, ops.v[i].path, ops.v[i].doc);
        else
            printf("    %-9s %s\n", where, ops.v[i].path);
    }
    if (ops.n == 0 && !ops.sources)
        fprintf(stderr, "opjit: no operator sources found on the search path %s (give "
                        "--ops-path DIR or set OPJIT_OPS_PATH)\n", loader_ops_path(rt));
    listed_free(&ops);
    opjit_destroy(rt);
    return fail ? OPJIT_EXIT_FAIL : OPJIT_EXIT_OK;
}

/* ---- load ---------------------------------------------------------------- */

static const char load_help[] =
    "usage: opjit load [options] FILE...\n"
    "\n"
    "Compile (or fetch from the cache) and register each operator source FILE,\n"
    "then print the operators it registered and how long each step took:\n"
    "hashing the cache key, compiling (0 on a cache hit), loading.\n"
    "A FILE that fails is reported on stderr and the rest are still loaded;\n"
    "the exit status is then 1.\n"
    "\n"
    "options:\n";

int opjit_cmd_load(int argc, char **argv)
{
    int nfiles = 0, only_files = 0;
    char **files = calloc((size_t)argc, sizeof *files);
    if (!files) {
        fprintf(stderr, "opjit: out of memory\n");
        return OPJIT_EXIT_FAIL;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_files && a[0] == '-' && a[1] != '\0') {
            if (strcmp(a, "--") == 0) {
                only_files = 1;
                continue;
            }
            if (is_help(a)) {
                printf("%s%s", load_help, opjit_cli_common_help);
                free(files);
                return OPJIT_EXIT_OK;
            }
            int r = common_opt(argc, argv, &i);
            if (r == 1)
                continue;
            free(files);
            return r < 0 ? OPJIT_EXIT_USAGE : usage_error("load", "unknown option '%s'", a);
        }
        files[nfiles++] = argv[i];
    }
    if (nfiles == 0) {
        free(files);
        return usage_error("load", "no source file given");
    }

    opjit_runtime *rt;
    if (opjit_cli_create(&rt) != OPJIT_EXIT_OK) {
        free(files);
        return OPJIT_EXIT_FAIL;
    }
    int fail = 0;
    for (int k = 0; k < nfiles; k++) {
        opjit_op *op = NULL;
        opjit_load_info info;
        memset(&info, 0, sizeof info);
        if (opjit_load_file(rt, files[k], &op, &info) != OPJIT_OK) {
            rt_error(rt, files[k]);
            fail = 1;
            continue;
        }
        const char *src = info.source[0] ? info.source : files[k];
        printf("%s: %s%s%s%s\n", src, info.cache_hit ? "cache hit" : "compiled (cache miss)",
               info.tier[0] ? " [" : "", info.tier[0] ? info.tier : "", info.tier[0] ? "]" : "");
        printf("    key %.2f ms, compile %.2f ms, load %.2f ms, total %.2f ms\n",
               info.key_ms, info.compile_ms, info.load_ms, info.total_ms);
        /* The ops whose kernels come from this source. */
        op_vec ops = {0};
        int shown = 0;
        opjit_list(rt, collect_op, &ops);
        for (size_t i = 0; i < ops.n; i++) {
            opjit_op_info oi;
            if (opjit_op_info_get(rt, ops.v[i], &oi) != OPJIT_OK)
                continue;
            char devs[64] = "";
            size_t n = 0;
            for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
                if (oi.source[d] && (same_file(oi.source[d], src) ||
                                     same_file(oi.source[d], files[k])))
                    n += (size_t)snprintf(devs + n, sizeof devs - n, "%s%s", n ? ", " : "",
                                          opjit_device_name(d) ? opjit_device_name(d) : "?");
            if (n == 0 && ops.v[i] != op)
                continue;
            printf("    %s  [%s]\n", oi.schema ? oi.schema : oi.name, devs);
            shown++;
        }
        if (!shown)
            printf("    (registered no operator)\n");
        free(ops.v);
    }
    opjit_destroy(rt);
    free(files);
    return fail ? OPJIT_EXIT_FAIL : OPJIT_EXIT_OK;
}

/* ---- call: printing tensors -------------------------------------------------- */

#define PRINT_MAX_ELEMENTS 1000
#define PRINT_LINE_WIDTH 75
#define ELEM_TEXT 64

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

/* Shortest text that reads back as v at the given precision: positional
 * for 1e-4 <= |v| < 1e16, else scientific, as numpy prints. */
static void format_float(char *buf, size_t len, double v, int is_f32)
{
    if (isnan(v)) {
        snprintf(buf, len, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, len, v < 0 ? "-inf" : "inf");
        return;
    }
    int maxp = is_f32 ? 9 : 17, p;
    char sci[32];
    for (p = 1; p <= maxp; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, v);
        double back = strtod(sci, NULL);
        if (is_f32 ? (float)back == (float)v : back == v)
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

static void format_elem(char *buf, size_t len, const DLTensor *t, int64_t k)
{
    const unsigned char *p = elem_ptr(t, k);
    DLDataType dt = t->dtype;
    if (dt.code == kDLFloat && dt.bits == 32) {
        float v;
        memcpy(&v, p, sizeof v);
        format_float(buf, len, v, 1);
    } else if (dt.code == kDLFloat && dt.bits == 64) {
        double v;
        memcpy(&v, p, sizeof v);
        format_float(buf, len, v, 0);
    } else if (dt.code == OPJIT_DL_BOOL) {
        snprintf(buf, len, "%s", *p ? "True" : "False");
    } else if (dt.code == kDLInt) {
        int64_t v = 0;
        switch (dt.bits) {
        case 8: { int8_t x; memcpy(&x, p, 1); v = x; break; }
        case 16: { int16_t x; memcpy(&x, p, 2); v = x; break; }
        case 32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
        default: memcpy(&v, p, 8); break;
        }
        snprintf(buf, len, "%lld", (long long)v);
    } else {
        uint64_t v = 0;
        switch (dt.bits) {
        case 8: v = *p; break;
        case 16: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
        case 32: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
        default: memcpy(&v, p, 8); break;
        }
        snprintf(buf, len, "%llu", (unsigned long long)v);
    }
}

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

static int host_tensor(const DLTensor *t)
{
    return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

/* "output 0: shape (2, 2), dtype float32" and the values when small. */
static void print_tensor(FILE *f, const char *label, const DLTensor *t)
{
    char shape[64 * 24], dbuf[64];
    format_shape(shape, sizeof shape, t);
    const char *dname = dtype_name(t->dtype, dbuf, sizeof dbuf);
    fprintf(f, "%s: shape %s, dtype %s\n", label, shape, dname);
    if (!npy_dtype_name(t->dtype)) {
        fprintf(f, "(this dtype cannot be printed)\n");
        return;
    }
    if (!host_tensor(t)) {
        fprintf(f, "(on device %s; save it with --out FILE.npy)\n",
                opjit_device_name(OPJIT_CUDA) ? opjit_device_name(OPJIT_CUDA) : "?");
        return;
    }
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] > PRINT_MAX_ELEMENTS) {
            numel = PRINT_MAX_ELEMENTS + 1;
            break;
        }
        numel *= t->shape[i];
        if (numel > PRINT_MAX_ELEMENTS) {
            numel = PRINT_MAX_ELEMENTS + 1;
            for (int j = i + 1; j < t->ndim; j++)
                if (t->shape[j] == 0)
                    numel = 0;
            break;
        }
    }
    if (numel > PRINT_MAX_ELEMENTS) {
        fprintf(f, "(more than %d elements: save it with --out FILE.npy)\n",
                PRINT_MAX_ELEMENTS);
        return;
    }
    if (numel == 0) {
        fprintf(f, "[]\n");
        return;
    }
    char(*text)[ELEM_TEXT] = malloc((size_t)numel * sizeof *text);
    if (!text) {
        fprintf(f, "(out of memory)\n");
        return;
    }
    for (int64_t k = 0; k < numel; k++)
        format_elem(text[k], sizeof text[k], t, k);
    if (t->dtype.code == kDLFloat)
        align_decimal_points(text, numel);
    int width = 0;
    for (int64_t k = 0; k < numel; k++) {
        int w = (int)strlen(text[k]);
        if (w > width)
            width = w;
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

/* ---- call ------------------------------------------------------------------ */

static const char call_help[] =
    "usage: opjit call [options] OP NAME=VALUE... [--device cpu|cuda]\n"
    "                  [--out FILE.npy]...\n"
    "\n"
    "Load the operator OP (a name looked up on the search path, or the path of a\n"
    "source file), call it with the named arguments and save or print its outputs.\n"
    "\n"
    "Each NAME is an argument of OP's schema ('opjit list' shows them); VALUE is\n"
    "  @FILE.npy     a tensor (float32, float64, int8..int64, uint8..uint64, bool)\n"
    "  3, -1         an int\n"
    "  0.5, 1, 1e-3  a float\n"
    "  true, false   a bool\n"
    "  2,3  or  2    an int[N] list (one value is repeated N times)\n"
    "  none          nothing: a Tensor? argument left empty, or the default\n"
    "Arguments with a default may be left out.\n"
    "\n"
    "Outputs are written to the --out files in order; outputs without a file are\n"
    "printed when they have at most 1000 elements.\n"
    "\n"
    "With --device cuda every tensor argument is copied to CUDA device 0, the op's\n"
    "CUDA kernel (its .cu source) runs there, and the outputs are copied back to\n"
    "the host to be saved or printed. It needs the NVIDIA driver (libcuda.so.1)\n"
    "and a GPU; without them the call fails, saying which is missing.\n"
    "\n"
    "options:\n"
    "  --out FILE.npy   save the next output to FILE.npy (repeatable)\n"
    "  --device DEV     cpu (the default) or cuda: run on GPU 0, copying the\n"
    "                   tensors there and the outputs back\n";

/* Everything a call owns, freed at the end. */
typedef struct call_state {
    opjit_runtime *rt;
    opjit_op *op;
    opjit_op_info info;
    opjit_value *vals;
    int *given;
    npy_array *arrays;
    int64_t **ints;
    DLManagedTensor **dev_args; /* --device cuda: the tensor arguments on the GPU */
    DLManagedTensor **outs;
} call_state;

static void call_state_free(call_state *cs)
{
    int n = cs->info.nargs;
    if (cs->outs) {
        for (int i = 0; i < cs->info.nouts; i++)
            if (cs->outs[i] && cs->outs[i]->deleter)
                cs->outs[i]->deleter(cs->outs[i]);
        free(cs->outs);
    }
    if (cs->dev_args) {
        for (int i = 0; i < n; i++)
            if (cs->dev_args[i] && cs->dev_args[i]->deleter)
                cs->dev_args[i]->deleter(cs->dev_args[i]);
        free(cs->dev_args);
    }
    if (cs->arrays)
        for (int i = 0; i < n; i++)
            npy_free(&cs->arrays[i]);
    if (cs->ints)
        for (int i = 0; i < n; i++)
            free(cs->ints[i]);
    free(cs->arrays);
    free(cs->ints);
    free(cs->vals);
    free(cs->given);
    opjit_destroy(cs->rt);
}

static int parse_int(const char *s, int64_t *out)
{
    char *end;
    while (*s == ' ')
        s++;
    if (!*s)
        return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    while (*end == ' ')
        end++;
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* N of "int[N]"; 0 when the type gives no N. */
static int ints_len_of_type(const char *type)
{
    const char *b = type ? strchr(type, '[') : NULL;
    return b ? atoi(b + 1) : 0;
}

/* VALUE text of argument ai into *v. Returns 0, or -1 with err set. */
static int parse_value(call_state *cs, int idx, const opjit_arg_info *ai, const char *text,
                       char *err, size_t errlen)
{
    opjit_value *v = &cs->vals[idx];
    const char *type = ai->type ? ai->type : "?";

    if (strcmp(text, "none") == 0 || strcmp(text, "None") == 0) {
        if (!ai->optional && !ai->has_default) {
            snprintf(err, errlen, "argument '%s' (%s) is required: 'none' is only for "
                     "Tensor? arguments and arguments with a default", ai->name, type);
            return -1;
        }
        *v = opjit_none();
        return 0;
    }
    switch (ai->kind) {
    case OPJIT_KIND_TENSOR: {
        if (text[0] != '@') {
            snprintf(err, errlen, "argument '%s' is a %s: give it as @FILE.npy, not '%s'",
                     ai->name, type, text);
            return -1;
        }
        char msg[512];
        if (text[1] == '\0') {
            snprintf(err, errlen, "argument '%s': '@' needs a file name: @FILE.npy", ai->name);
            return -1;
        }
        if (npy_read(text + 1, &cs->arrays[idx], msg, sizeof msg) != 0) {
            snprintf(err, errlen, "argument '%s': %s", ai->name, msg);
            return -1;
        }
        *v = opjit_tensor(&cs->arrays[idx].t);
        return 0;
    }
    case OPJIT_KIND_INT: {
        int64_t i;
        if (parse_int(text, &i) != 0) {
            snprintf(err, errlen, "argument '%s' is an int: '%s' is not an integer",
                     ai->name, text);
            return -1;
        }
        *v = opjit_int(i);
        return 0;
    }
    case OPJIT_KIND_FLOAT: {
        char *end;
        errno = 0;
        double f = strtod(text, &end);
        if (end == text || *end || (errno == ERANGE && isinf(f))) {
            snprintf(err, errlen, "argument '%s' is a float: '%s' is not a number",
                     ai->name, text);
            return -1;
        }
        *v = opjit_float(f);
        return 0;
    }
    case OPJIT_KIND_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "1")) {
            *v = opjit_bool(1);
            return 0;
        }
        if (!strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "0")) {
            *v = opjit_bool(0);
            return 0;
        }
        snprintf(err, errlen, "argument '%s' is a bool: give true or false, not '%s'",
                 ai->name, text);
        return -1;
    case OPJIT_KIND_INTS: {
        int want = ai->list_len > 0 ? ai->list_len : ints_len_of_type(ai->type);
        size_t tl = strlen(text);
        char *copy = malloc(tl + 1);
        int cap = 1;
        for (const char *p = text; *p; p++)
            cap += *p == ',';
        int64_t *vals = malloc(sizeof(int64_t) * (size_t)(cap > want ? cap : want));
        if (!copy || !vals) {
            free(copy);
            free(vals);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        memcpy(copy, text, tl + 1);
        /* allow [2, 3] and (2, 3) */
        char *s = copy;
        if ((*s == '[' || *s == '(') && tl >= 2 &&
            (copy[tl - 1] == ']' || copy[tl - 1] == ')')) {
            s++;
            copy[tl - 1] = '\0';
        }
        int n = 0, bad = 0;
        for (char *tok = s;; n++) {
            char *comma = strchr(tok, ',');
            if (comma)
                *comma = '\0';
            if (parse_int(tok, &vals[n]) != 0) {
                bad = 1;
                break;
            }
            if (!comma)
                break;
            tok = comma + 1;
        }
        free(copy);
        if (bad) {
            snprintf(err, errlen, "argument '%s' is an %s: '%s' is not a list of integers "
                     "like 2,3", ai->name, type, text);
            free(vals);
            return -1;
        }
        n++;
        if (want > 0 && n == 1) {
            for (int i = 1; i < want; i++)
                vals[i] = vals[0];
            n = want;
        }
        if (want > 0 && n != want) {
            snprintf(err, errlen, "argument '%s' is an %s: it takes %d integers (or one, "
                     "repeated), got %d", ai->name, type, want, n);
            free(vals);
            return -1;
        }
        cs->ints[idx] = vals;
        *v = opjit_ints(vals, n);
        return 0;
    }
    default:
        snprintf(err, errlen, "argument '%s' has a type (%s) the command line cannot give",
                 ai->name, type);
        return -1;
    }
}

/* The op for OP: loaded by name or path. */
static int call_load_op(call_state *cs, const char *spec)
{
    if (opjit_load_op(cs->rt, spec, &cs->op) != OPJIT_OK) {
        rt_error(cs->rt, spec);
        return -1;
    }
    if (cs->op)
        return 0;
    /* A path: the op named after the file ("dir/add1.c" -> "add1"). */
    const char *base = strrchr(spec, '/');
    base = base ? base + 1 : spec;
    size_t stem = source_stem(base);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(stem ? stem : strlen(base)), base);
    if (opjit_find_op(cs->rt, name, &cs->op) != OPJIT_OK || !cs->op) {
        fprintf(stderr, "opjit: %s: loaded, but it registers no operator named '%s'\n",
                spec, name);
        return -1;
    }
    return 0;
}

int opjit_cmd_call(int argc, char **argv)
{
    const char *opname = NULL, *device = "cpu";
    const char **assigns = calloc((size_t)argc, sizeof *assigns);
    const char **out_paths = calloc((size_t)argc, sizeof *out_paths);
    int nassign = 0, nout_paths = 0, only_pos = 0, rc = OPJIT_EXIT_FAIL;
    call_state cs;
    memset(&cs, 0, sizeof cs);
    if (!assigns || !out_paths) {
        fprintf(stderr, "opjit: out of memory\n");
        goto done;
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        int r;
        if (!only_pos && a[0] == '-' && a[1] != '\0') {
            if (strcmp(a, "--") == 0) {
                only_pos = 1;
                continue;
            }
            if (is_help(a)) {
                printf("%s%s", call_help, opjit_cli_common_help);
                rc = OPJIT_EXIT_OK;
                goto done;
            }
            if ((r = opt_value(argc, argv, &i, "--out", &val)) != 0) {
                if (r < 0 || !*val) {
                    rc = r < 0 ? OPJIT_EXIT_USAGE : usage_error("call", "--out needs a file");
                    goto done;
                }
                out_paths[nout_paths++] = val;
                continue;
            }
            if ((r = opt_value(argc, argv, &i, "--device", &val)) != 0) {
                if (r < 0) {
                    rc = OPJIT_EXIT_USAGE;
                    goto done;
                }
                if (strcmp(val, "cpu") != 0 && strcmp(val, "cuda") != 0) {
                    rc = usage_error("call", "--device must be cpu or cuda, not '%s'", val);
                    goto done;
                }
                device = val;
                continue;
            }
            r = common_opt(argc, argv, &i);
            if (r == 1)
                continue;
            rc = r < 0 ? OPJIT_EXIT_USAGE : usage_error("call", "unknown option '%s'", a);
            goto done;
        }
        if (!opname) {
            if (!*a) {
                rc = usage_error("call", "the operator name is empty");
                goto done;
            }
            opname = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        if (!eq || eq == a) {
            rc = usage_error("call", "expected NAME=VALUE, got '%s'", a);
            goto done;
        }
        assigns[nassign++] = a;
    }
    if (!opname) {
        rc = usage_error("call", "no operator given");
        goto done;
    }
    int on_cuda = strcmp(device, "cuda") == 0;

    if (opjit_cli_create(&cs.rt) != OPJIT_EXIT_OK)
        goto done;
    if (call_load_op(&cs, opname) != 0)
        goto done;
    if (opjit_op_info_get(cs.rt, cs.op, &cs.info) != OPJIT_OK) {
        rt_error(cs.rt, opname);
        goto done;
    }
    const char *schema = cs.info.schema ? cs.info.schema : cs.info.name;
    int nargs = cs.info.nargs, nouts = cs.info.nouts;
    size_t na = nargs > 0 ? (size_t)nargs : 1;
    cs.vals = calloc(na, sizeof *cs.vals);
    cs.given = calloc(na, sizeof *cs.given);
    cs.arrays = calloc(na, sizeof *cs.arrays);
    cs.ints = calloc(na, sizeof *cs.ints);
    cs.dev_args = calloc(na, sizeof *cs.dev_args);
    cs.outs = calloc(nouts > 0 ? (size_t)nouts : 1, sizeof *cs.outs);
    if (!cs.vals || !cs.given || !cs.arrays || !cs.ints || !cs.dev_args || !cs.outs) {
        fprintf(stderr, "opjit: out of memory\n");
        goto done;
    }
    for (int i = 0; i < nargs; i++)
        cs.vals[i] = opjit_none();

    for (int k = 0; k < nassign; k++) {
        const char *eq = strchr(assigns[k], '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - assigns[k]), assigns[k]);
        int idx = opjit_op_arg_index(cs.op, name);
        if (idx < 0 || idx >= nargs) {
            fprintf(stderr, "opjit: %s has no argument '%s'; its schema is %s\n",
                    cs.info.name, name, schema);
            goto done;
        }
        if (cs.given[idx]) {
            fprintf(stderr, "opjit: argument '%s' is given twice\n", name);
            goto done;
        }
        opjit_arg_info ai;
        if (opjit_op_arg(cs.rt, cs.op, idx, &ai) != OPJIT_OK) {
            rt_error(cs.rt, cs.info.name);
            goto done;
        }
        char err[1024];
        if (parse_value(&cs, idx, &ai, eq + 1, err, sizeof err) != 0) {
            fprintf(stderr, "opjit: %s: %s\n", cs.info.name, err);
            goto done;
        }
        cs.given[idx] = 1;
    }

    /* Missing required arguments, all named at once. */
    char missing[1024] = "";
    size_t mlen = 0;
    int nmissing = 0;
    for (int i = 0; i < nargs; i++) {
        opjit_arg_info ai;
        if (cs.given[i] || opjit_op_arg(cs.rt, cs.op, i, &ai) != OPJIT_OK)
            continue;
        if (ai.optional || ai.has_default)
            continue;
        if (mlen < sizeof missing)
            mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s'%s' (%s)",
                                     nmissing ? ", " : "", ai.name,
                                     ai.type ? ai.type : "?");
        nmissing++;
    }
    if (nmissing) {
        fprintf(stderr, "opjit: %s: missing required argument%s %s; its schema is %s\n",
                cs.info.name, nmissing > 1 ? "s" : "", missing, schema);
        goto done;
    }
    if (nout_paths > nouts) {
        fprintf(stderr, "opjit: %s has %d output%s but %d --out files were given\n",
                cs.info.name, nouts, nouts == 1 ? "" : "s", nout_paths);
        goto done;
    }

    /* --device cuda: every tensor to GPU 0, so that the CUDA kernel runs. */
    for (int i = 0; on_cuda && i < nargs; i++) {
        if (cs.vals[i].kind != OPJIT_KIND_TENSOR)
            continue;
        if (opjit_tensor_to_device(cs.rt, cs.vals[i].u.tensor, OPJIT_CUDA, 0,
                                   &cs.dev_args[i]) != OPJIT_OK) {
            opjit_arg_info ai;
            const char *name = opjit_op_arg(cs.rt, cs.op, i, &ai) == OPJIT_OK ? ai.name : "?";
            fprintf(stderr, "opjit: %s: --device cuda: argument '%s': %s\n", cs.info.name, name,
                    opjit_errmsg(cs.rt));
            goto done;
        }
        cs.vals[i] = opjit_tensor(&cs.dev_args[i]->dl_tensor);
    }

    if (opjit_call(cs.rt, cs.op, cs.vals, nargs, cs.outs, nouts) != OPJIT_OK) {
        rt_error(cs.rt, cs.info.name);
        goto done;
    }

    /* Outputs on a GPU come back to the host, to be saved or printed. */
    for (int k = 0; k < nouts; k++) {
        DLManagedTensor *o = cs.outs[k], *host = NULL;
        if (!o || host_tensor(&o->dl_tensor))
            continue;
        if (opjit_tensor_to_device(cs.rt, &o->dl_tensor, OPJIT_CPU, 0, &host) != OPJIT_OK) {
            fprintf(stderr, "opjit: %s: output %d: %s\n", cs.info.name, k, opjit_errmsg(cs.rt));
            goto done;
        }
        o->deleter(o);
        cs.outs[k] = host;
    }

    rc = OPJIT_EXIT_OK;
    for (int k = 0; k < nouts; k++) {
        if (!cs.outs[k]) {
            fprintf(stderr, "opjit: %s: output %d is missing\n", cs.info.name, k);
            rc = OPJIT_EXIT_FAIL;
            continue;
        }
        const DLTensor *t = &cs.outs[k]->dl_tensor;
        if (k < nout_paths) {
            char err[1024], shape[64 * 24], dbuf[64];
            if (npy_write(out_paths[k], t, err, sizeof err) != 0) {
                fprintf(stderr, "opjit: output %d: %s\n", k, err);
                rc = OPJIT_EXIT_FAIL;
                continue;
            }
            format_shape(shape, sizeof shape, t);
            printf("output %d: shape %s, dtype %s -> %s\n", k, shape,
                   dtype_name(t->dtype, dbuf, sizeof dbuf), out_paths[k]);
        } else {
            char label[32];
            snprintf(label, sizeof label, "output %d", k);
            print_tensor(stdout, label, t);
        }
    }

done:
    call_state_free(&cs);
    free(assigns);
    free(out_paths);
    return rc;
}

/* ---- main ------------------------------------------------------------------ */

typedef struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} cli_command;

static const cli_command cli_commands[] = {
    {"list", opjit_cmd_list, "list the operators on the search path, with their schemas"},
    {"load", opjit_cmd_load, "compile and register source files, with timings"},
    {"call", opjit_cmd_call, "call an operator on .npy tensors and numbers"},
    {"warm", opjit_cmd_warm, "compile operators into the cache ahead of time"},
    {"cache", opjit_cmd_cache, "list, verify, prune and clear the cache"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: opjit [options] COMMAND [ARGS...]\n"
            "       opjit --version\n"
            "\n"
            "Compile tensor operators from C and CUDA sources at run time, cache them,\n"
            "and call them.\n"
            "\n"
            "commands:\n");
    for (const cli_command *c = cli_commands; c->name; c++)
        fprintf(f, "  %-8s %s\n", c->name, c->summary);
    fprintf(f, "  %-8s %s\n", "help", "show the help of a command");
    fprintf(f, "\noptions:\n%s", opjit_cli_common_help);
    fprintf(f, "  -h, --help       this help\n"
               "  --version        the version of opjit\n"
               "\n"
               "Run 'opjit COMMAND --help' for the options of a command.\n");
}

static const cli_command *find_command(const char *name)
{
    for (const cli_command *c = cli_commands; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

static int run(int argc, char **argv)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-')
            break;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (is_help(a)) {
            usage(stdout);
            return OPJIT_EXIT_OK;
        }
        if (strcmp(a, "--version") == 0) {
            printf("opjit %s\n", opjit_version_string());
            if (opjit_version() != OPJIT_VERSION_NUMBER)
                fprintf(stderr, "opjit: warning: built with opjit.h %d.%d.%d but linked "
                                "with library %s\n",
                        OPJIT_VERSION_MAJOR, OPJIT_VERSION_MINOR, OPJIT_VERSION_PATCH,
                        opjit_version_string());
            return OPJIT_EXIT_OK;
        }
        int r = opjit_cli_common_option(argc, argv, &i);
        if (r == OPJIT_EXIT_USAGE)
            return OPJIT_EXIT_USAGE;
        if (r == 1) {
            i--;
            continue;
        }
        return usage_error(NULL, "unknown option '%s'", a);
    }
    if (i >= argc) {
        usage(stderr);
        return OPJIT_EXIT_USAGE;
    }
    const char *name = argv[i];
    if (strcmp(name, "help") == 0) {
        if (i + 1 >= argc) {
            usage(stdout);
            return OPJIT_EXIT_OK;
        }
        const cli_command *c = find_command(argv[i + 1]);
        if (!c)
            return usage_error(NULL, "unknown command '%s'", argv[i + 1]);
        char *help_argv[] = {(char *)c->name, "--help", NULL};
        return c->fn(2, help_argv);
    }
    const cli_command *c = find_command(name);
    if (!c)
        return usage_error(NULL, "unknown command '%s'", name);
    return c->fn(argc - i, argv + i);
}

int main(int argc, char **argv)
{
    int rc = run(argc, argv);
    if (fflush(stdout) != 0 && rc == OPJIT_EXIT_OK) {
        fprintf(stderr, "opjit: error writing the output: %s\n", strerror(errno));
        rc = OPJIT_EXIT_FAIL;
    }
    free(g_opt.ops_path);
    return rc;
}
