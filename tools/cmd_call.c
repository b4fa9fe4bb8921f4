/*
 * tools/cmd_call.c - `opjit call`: load an operator, call it with named
 * arguments given on the command line (.npy tensors, numbers, lists) and
 * save or print its outputs.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/npy.h"

static const char call_help[] =
    "usage: opjit call [options] OP NAME=VALUE... [--device cpu|cuda]\n"
    "                  [--out FILE.npy]...\n"
    "\n"
    "Load the operator OP (a name looked up on the search path, or the path of a\n"
    "source file), call it with the named arguments and save or print its outputs.\n"
    "\n"
    "Each NAME is an argument of OP's schema ('opjit list' shows them); VALUE is\n"
    "  @FILE.npy     a tensor (float16/32/64, int8..int64, uint8..uint64, bool)\n"
    "  3, -1         an int\n"
    "  0.5, 1, 1e-3  a float\n"
    "  true, false   a bool\n"
    "  2,3  or  2    an int[N] list (one value is repeated N times)\n"
    "  same          a str, as given (padding=same)\n"
    "  none          nothing: a Tensor? argument left empty, or the default\n"
    "Arguments with a default may be left out.\n"
    "\n"
    "Outputs are written to the --out files in order; outputs without a file are\n"
    "printed when they have at most 1000 elements.\n"
    "\n"
    "With --device cuda every tensor argument is copied to CUDA device 0, the op's\n"
    "CUDA kernel (its .cu source) runs there, and the outputs are copied back to\n"
    "the host to be saved or printed. It needs the NVIDIA driver (libcuda.so.1)\n"
    "and a GPU; without them the call fails, saying which is missing. An op\n"
    "without a CUDA kernel fails, saying which devices it has.\n"
    "\n"
    "options:\n"
    "  --out FILE.npy   save the next output to FILE.npy (repeatable)\n"
    "  --device DEV     cpu (the default) or cuda: run on GPU 0, copying the\n"
    "                   tensors there and the outputs back\n"
    "  --json           print JSON: {\"op\", \"device\", \"outputs\": [{\"index\",\n"
    "                   \"shape\", \"dtype\", \"values\", \"file\"}]} (values null when\n"
    "                   saved to a file or too large to print)\n";

/* The command line, parsed. The strings point into argv. */
typedef struct call_args {
    const char *opname, *device;
    int json;
    const char **assigns; /* NAME=VALUE */
    const char **out_paths;
    int nassign, nout_paths;
} call_args;

/* Everything a call owns, freed at the end. */
typedef struct call_state {
    opjit_runtime *rt;
    opjit_op *op;
    opjit_op_info info;
    const char *schema; /* info.schema, else info.name */
    opjit_value *vals;
    int *given;
    npy_array *arrays;
    int64_t **ints;
    DLManagedTensor **dev_args; /* --device cuda: the tensor arguments on the GPU */
    DLManagedTensor **outs;
} call_state;

static void free_managed(DLManagedTensor **v, int n)
{
    for (int i = 0; v && i < n; i++)
        if (v[i] && v[i]->deleter)
            v[i]->deleter(v[i]);
    free(v);
}

static void call_state_free(call_state *cs)
{
    int n = cs->info.nargs;
    free_managed(cs->outs, cs->info.nouts);
    free_managed(cs->dev_args, n);
    for (int i = 0; cs->arrays && i < n; i++)
        npy_free(&cs->arrays[i]);
    for (int i = 0; cs->ints && i < n; i++)
        free(cs->ints[i]);
    free(cs->arrays);
    free(cs->ints);
    free(cs->vals);
    free(cs->given);
    opjit_destroy(cs->rt);
}

/* ---- VALUE text ---------------------------------------------------------------- */

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

static int parse_tensor_value(call_state *cs, int idx, const opjit_arg_info *ai,
                              const char *text, char *err, size_t errlen)
{
    char msg[512];
    if (text[0] != '@') {
        snprintf(err, errlen, "argument '%s' is a %s: give it as @FILE.npy, not '%s'", ai->name,
                 ai->type ? ai->type : "?", text);
        return -1;
    }
    if (text[1] == '\0') {
        snprintf(err, errlen, "argument '%s': '@' needs a file name: @FILE.npy", ai->name);
        return -1;
    }
    if (npy_read(text + 1, &cs->arrays[idx], msg, sizeof msg) != 0) {
        snprintf(err, errlen, "argument '%s': %s", ai->name, msg);
        return -1;
    }
    cs->vals[idx] = opjit_tensor(&cs->arrays[idx].t);
    return 0;
}

static int parse_scalar_value(opjit_value *v, const opjit_arg_info *ai, const char *text,
                              char *err, size_t errlen)
{
    int64_t i;
    char *end;
    if (ai->kind == OPJIT_KIND_INT) {
        if (parse_int(text, &i) == 0) {
            *v = opjit_int(i);
            return 0;
        }
        snprintf(err, errlen, "argument '%s' is an int: '%s' is not an integer", ai->name, text);
        return -1;
    }
    if (ai->kind == OPJIT_KIND_FLOAT) {
        errno = 0;
        double f = strtod(text, &end);
        if (end != text && !*end && !(errno == ERANGE && isinf(f))) {
            *v = opjit_float(f);
            return 0;
        }
        snprintf(err, errlen, "argument '%s' is a float: '%s' is not a number", ai->name, text);
        return -1;
    }
    if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "1")) {
        *v = opjit_bool(1);
        return 0;
    }
    if (!strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "0")) {
        *v = opjit_bool(0);
        return 0;
    }
    snprintf(err, errlen, "argument '%s' is a bool: give true or false, not '%s'", ai->name,
             text);
    return -1;
}

/* "2,3", "[2, 3]", "(2, 3)" into vals (room for every comma + 1): the
 * count, or -1. */
static int split_ints(const char *text, int64_t *vals)
{
    size_t tl = strlen(text);
    char *copy = strdup(text), *s = copy;
    int n = 0, bad = !copy;
    if (!bad && (*s == '[' || *s == '(') && tl >= 2 &&
        (copy[tl - 1] == ']' || copy[tl - 1] == ')')) {
        s++;
        copy[tl - 1] = '\0';
    }
    for (char *tok = s; !bad; n++) {
        char *comma = strchr(tok, ',');
        if (comma)
            *comma = '\0';
        bad = parse_int(tok, &vals[n]) != 0;
        if (!comma)
            break;
        tok = comma + 1;
    }
    free(copy);
    return bad ? -1 : n + 1;
}

static int parse_ints_value(call_state *cs, int idx, const opjit_arg_info *ai,
                            const char *text, char *err, size_t errlen)
{
    const char *type = ai->type ? ai->type : "?";
    int want = ai->list_len > 0 ? ai->list_len : ints_len_of_type(ai->type), cap = 1;
    for (const char *p = text; *p; p++)
        cap += *p == ',';
    int64_t *vals = malloc(sizeof(int64_t) * (size_t)(cap > want ? cap : want));
    int n = vals ? split_ints(text, vals) : -1;
    if (!vals)
        snprintf(err, errlen, "out of memory");
    else if (n < 0)
        snprintf(err, errlen, "argument '%s' is an %s: '%s' is not a list of integers "
                 "like 2,3", ai->name, type, text);
    for (int i = 1; n == 1 && i < want; i++)
        vals[i] = vals[0];
    if (n == 1 && want > 0)
        n = want;
    if (n > 0 && want > 0 && n != want) {
        snprintf(err, errlen, "argument '%s' is an %s: it takes %d integers (or one, "
                 "repeated), got %d", ai->name, type, want, n);
        n = -1;
    }
    if (n < 0) {
        free(vals);
        return -1;
    }
    cs->ints[idx] = vals;
    cs->vals[idx] = opjit_ints(vals, n);
    return 0;
}

/* VALUE text of argument idx (described by ai). 0, or -1 with err set. */
static int parse_value(call_state *cs, int idx, const opjit_arg_info *ai, const char *text,
                       char *err, size_t errlen)
{
    if (strcmp(text, "none") == 0 || strcmp(text, "None") == 0) {
        if (!ai->optional && !ai->has_default) {
            snprintf(err, errlen, "argument '%s' (%s) is required: 'none' is only for "
                     "Tensor? arguments and arguments with a default", ai->name,
                     ai->type ? ai->type : "?");
            return -1;
        }
        cs->vals[idx] = opjit_none();
        return 0;
    }
    switch (ai->kind) {
    case OPJIT_KIND_TENSOR:
        return parse_tensor_value(cs, idx, ai, text, err, errlen);
    case OPJIT_KIND_INT:
    case OPJIT_KIND_FLOAT:
    case OPJIT_KIND_BOOL:
        return parse_scalar_value(&cs->vals[idx], ai, text, err, errlen);
    case OPJIT_KIND_INTS:
        return parse_ints_value(cs, idx, ai, text, err, errlen);
    case OPJIT_KIND_STR: /* as given: padding=same */
        cs->vals[idx] = opjit_str(text);
        return 0;
    default:
        snprintf(err, errlen, "argument '%s' has a type (%s) the command line cannot give",
                 ai->name, ai->type ? ai->type : "?");
        return -1;
    }
}

/* ---- the command line ------------------------------------------------------------ */

/* The option at argv[*i]: -2 to go on, else the exit status to end with
 * (help printed, a usage error). */
static int call_option(int argc, char **argv, int *i, call_args *ca)
{
    const char *a = argv[*i], *val;
    int r;
    if (cli_is_help(a)) {
        printf("%s%s", call_help, cli_common_help);
        return CLI_EXIT_OK;
    }
    if (strcmp(a, "--json") == 0) {
        ca->json = 1;
        return -2;
    }
    if ((r = cli_opt_value(argc, argv, i, "--out", &val)) != 0) {
        if (r < 0 || !*val)
            return r < 0 ? CLI_EXIT_USAGE : cli_usage_error("call", "--out needs a file");
        ca->out_paths[ca->nout_paths++] = val;
        return -2;
    }
    if ((r = cli_opt_value(argc, argv, i, "--device", &val)) != 0) {
        if (r < 0)
            return CLI_EXIT_USAGE;
        if (strcmp(val, "cpu") != 0 && strcmp(val, "cuda") != 0)
            return cli_usage_error("call", "--device must be cpu or cuda, not '%s'", val);
        ca->device = val;
        return -2;
    }
    r = cli_common_opt(argc, argv, i);
    if (r == 1)
        return -2;
    return r < 0 ? CLI_EXIT_USAGE : cli_usage_error("call", "unknown option '%s'", a);
}

/* argv into ca: -1 to go on, else the exit status to end with. */
static int parse_call_args(int argc, char **argv, call_args *ca)
{
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq;
        if (!only_pos && a[0] == '-' && a[1] != '\0') {
            if (strcmp(a, "--") == 0) {
                only_pos = 1;
                continue;
            }
            int r = call_option(argc, argv, &i, ca);
            if (r != -2)
                return r;
        } else if (!ca->opname) {
            if (!*a)
                return cli_usage_error("call", "the operator name is empty");
            ca->opname = a;
        } else if (!(eq = strchr(a, '=')) || eq == a) {
            return cli_usage_error("call", "expected NAME=VALUE, got '%s'", a);
        } else {
            ca->assigns[ca->nassign++] = a;
        }
    }
    return ca->opname ? -1 : cli_usage_error("call", "no operator given");
}

/* ---- the call -------------------------------------------------------------------- */

/* Edit distance of a and b, a swap of neighbours counting one (optimal
 * string alignment); names longer than 64: far. */
static size_t edit_distance(const char *a, const char *b)
{
    enum { MAX = 64 };
    size_t m = strlen(a), n = strlen(b), d[MAX + 1][MAX + 1];
    if (m > MAX || n > MAX)
        return (size_t)-1;
    for (size_t i = 0; i <= m; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= n; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= m; i++)
        for (size_t j = 1; j <= n; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            best = d[i - 1][j] + 1 < best ? d[i - 1][j] + 1 : best;
            best = d[i][j - 1] + 1 < best ? d[i][j - 1] + 1 : best;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[m][n];
}

typedef struct near_name {
    const char *want;
    char best[NAME_MAX + 1];
    size_t dist;
} near_name;

static int consider_source(void *ud, const char *path)
{
    near_name *nn = ud;
    const char *file = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t stem = cli_source_stem(file);
    char name[NAME_MAX + 1];
    if (!stem || stem > NAME_MAX)
        return 0;
    snprintf(name, sizeof name, "%.*s", (int)stem, file);
    size_t d = edit_distance(nn->want, name);
    if (d < nn->dist) {
        nn->dist = d;
        snprintf(nn->best, sizeof nn->best, "%s", name);
    }
    return 0;
}

/* A name that failed to load: the source on the search path whose name is
 * nearest, when it is near (a typo), as a hint. */
static void suggest_name(opjit_runtime *rt, const char *spec)
{
    near_name nn = {spec, "", (size_t)-1};
    if (strchr(spec, '/') || strstr(spec, "::"))
        return;
    opjit_sources(rt, NULL, consider_source, &nn);
    size_t len = strlen(spec), allow = len <= 4 ? 1 : 2;
    if (nn.best[0] && nn.dist > 0 && nn.dist <= allow)
        fprintf(stderr, "opjit: did you mean '%s'?\n", nn.best);
}

/* The op for OP: loaded by name or path. */
static int call_load_op(call_state *cs, const char *spec)
{
    int rc = opjit_load_op(cs->rt, spec, &cs->op);
    if (rc != OPJIT_OK) {
        cli_rt_error(cs->rt, spec);
        if (rc == OPJIT_ENOTFOUND)
            suggest_name(cs->rt, spec);
        return -1;
    }
    if (cs->op)
        return 0;
    /* A path: the op named after the file ("dir/add1.c" -> "add1"). */
    const char *base = strrchr(spec, '/');
    base = base ? base + 1 : spec;
    size_t stem = cli_source_stem(base);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(stem ? stem : strlen(base)), base);
    if (opjit_find_op(cs->rt, name, &cs->op) != OPJIT_OK || !cs->op) {
        fprintf(stderr, "opjit: %s: loaded, but it registers no operator named '%s'\n", spec,
                name);
        return -1;
    }
    return 0;
}

/* Load the op, describe it and allocate the per-argument arrays. */
static int call_prepare(call_state *cs, const char *opname)
{
    if (cli_create(&cs->rt) != CLI_EXIT_OK || call_load_op(cs, opname) != 0)
        return -1;
    cs->info.size = sizeof cs->info;
    if (opjit_op_info_get(cs->rt, cs->op, &cs->info) != OPJIT_OK) {
        cli_rt_error(cs->rt, opname);
        return -1;
    }
    cs->schema = cs->info.schema ? cs->info.schema : cs->info.name;
    size_t na = cs->info.nargs > 0 ? (size_t)cs->info.nargs : 1;
    cs->vals = calloc(na, sizeof *cs->vals);
    cs->given = calloc(na, sizeof *cs->given);
    cs->arrays = calloc(na, sizeof *cs->arrays);
    cs->ints = calloc(na, sizeof *cs->ints);
    cs->dev_args = calloc(na, sizeof *cs->dev_args);
    cs->outs = calloc(cs->info.nouts > 0 ? (size_t)cs->info.nouts : 1, sizeof *cs->outs);
    if (!cs->vals || !cs->given || !cs->arrays || !cs->ints || !cs->dev_args || !cs->outs) {
        fprintf(stderr, "opjit: out of memory\n");
        return -1;
    }
    for (int i = 0; i < cs->info.nargs; i++)
        cs->vals[i] = opjit_none();
    return 0;
}

/* One NAME=VALUE into its argument. */
static int call_bind(call_state *cs, const char *assign)
{
    const char *eq = strchr(assign, '=');
    char name[128], err[1024];
    opjit_arg_info ai = {.size = sizeof ai};
    snprintf(name, sizeof name, "%.*s", (int)(eq - assign), assign);
    int idx = opjit_op_arg_index(cs->op, name);
    if (idx < 0 || idx >= cs->info.nargs) {
        fprintf(stderr, "opjit: %s has no argument '%s'; its schema is %s\n", cs->info.name,
                name, cs->schema);
        return -1;
    }
    if (cs->given[idx]) {
        fprintf(stderr, "opjit: argument '%s' is given twice\n", name);
        return -1;
    }
    if (opjit_op_arg_get(cs->rt, cs->op, idx, &ai) != OPJIT_OK) {
        cli_rt_error(cs->rt, cs->info.name);
        return -1;
    }
    if (parse_value(cs, idx, &ai, eq + 1, err, sizeof err) != 0) {
        fprintf(stderr, "opjit: %s: %s\n", cs->info.name, err);
        return -1;
    }
    cs->given[idx] = 1;
    return 0;
}

/* Missing required arguments, all named at once. */
static int call_check_missing(call_state *cs)
{
    char missing[1024] = "";
    size_t mlen = 0;
    int nmissing = 0;
    for (int i = 0; i < cs->info.nargs; i++) {
        opjit_arg_info ai = {.size = sizeof ai};
        if (cs->given[i] || opjit_op_arg_get(cs->rt, cs->op, i, &ai) != OPJIT_OK)
            continue;
        if (ai.optional || ai.has_default)
            continue;
        if (mlen < sizeof missing)
            mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s'%s' (%s)",
                                     nmissing ? ", " : "", ai.name, ai.type ? ai.type : "?");
        nmissing++;
    }
    if (!nmissing)
        return 0;
    fprintf(stderr, "opjit: %s: missing required argument%s %s; its schema is %s\n",
            cs->info.name, nmissing > 1 ? "s" : "", missing, cs->schema);
    return -1;
}

/* A .cu source of the op's name on the search path, into *path. */
static int find_cu(void *ud, const char *path)
{
    char **cu = ud;
    size_t n = strlen(path);
    if (n > 3 && !strcmp(path + n - 3, ".cu") && !*cu)
        *cu = strdup(path);
    return *cu != NULL;
}

/* --device cuda on an op without a CUDA kernel: say so, with the devices
 * it has, or why its .cu source is not usable here. 0 when it has one. */
static int call_check_cuda_kernel(call_state *cs, const char *spec)
{
    if (cs->info.source[OPJIT_CUDA] || cs->info.tier[OPJIT_CUDA])
        return 0;
    /* A load by name leaves out a .cu that cannot run here (no driver, no
     * GPU): loaded now, it says why, or the copy to the GPU will. */
    char *cu = NULL;
    int st = OPJIT_OK;
    if (!strchr(spec, '/') && !cli_source_stem(spec))
        opjit_sources(cs->rt, cs->info.name, find_cu, &cu);
    if (cu && (st = opjit_load_file(cs->rt, cu, NULL, NULL)) == OPJIT_OK &&
        opjit_op_info_get(cs->rt, cs->op, &cs->info) == OPJIT_OK &&
        (cs->info.source[OPJIT_CUDA] || cs->info.tier[OPJIT_CUDA])) {
        free(cu);
        return 0;
    }
    if (st != OPJIT_OK) {
        fprintf(stderr, "opjit: %s: --device cuda: %s\n", cs->info.name, opjit_errmsg(cs->rt));
    } else {
        char devs[64] = "";
        size_t n = 0;
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
            if ((cs->info.source[d] || cs->info.tier[d]) && opjit_device_name(d))
                n += (size_t)snprintf(devs + n, sizeof devs - n, "%s%s", n ? ", " : "",
                                      opjit_device_name(d));
        fprintf(stderr, "opjit: %s has no CUDA kernel: it runs on %s (a CUDA kernel comes "
                "from a %s.cu source); leave out --device cuda\n", cs->info.name,
                n ? devs : "no device", cs->info.name);
    }
    free(cu);
    return -1;
}

/* --device cuda: every tensor to GPU 0, so that the CUDA kernel runs. */
static int call_to_cuda(call_state *cs)
{
    for (int i = 0; i < cs->info.nargs; i++) {
        if (cs->vals[i].kind != OPJIT_KIND_TENSOR)
            continue;
        if (opjit_tensor_to_device(cs->rt, cs->vals[i].u.tensor, OPJIT_CUDA, 0,
                                   &cs->dev_args[i]) != OPJIT_OK) {
            opjit_arg_info ai = {.size = sizeof ai};
            const char *name = opjit_op_arg_get(cs->rt, cs->op, i, &ai) == OPJIT_OK ? ai.name : "?";
            fprintf(stderr, "opjit: %s: --device cuda: argument '%s': %s\n", cs->info.name,
                    name, opjit_errmsg(cs->rt));
            return -1;
        }
        cs->vals[i] = opjit_tensor(&cs->dev_args[i]->dl_tensor);
    }
    return 0;
}

/* Outputs on a GPU come back to the host, to be saved or printed. */
static int call_outputs_to_host(call_state *cs)
{
    for (int k = 0; k < cs->info.nouts; k++) {
        DLManagedTensor *o = cs->outs[k], *host = NULL;
        if (!o || cli_host_tensor(&o->dl_tensor))
            continue;
        if (opjit_tensor_to_device(cs->rt, &o->dl_tensor, OPJIT_CPU, 0, &host) != OPJIT_OK) {
            fprintf(stderr, "opjit: %s: output %d: %s\n", cs->info.name, k,
                    opjit_errmsg(cs->rt));
            return -1;
        }
        o->deleter(o);
        cs->outs[k] = host;
    }
    return 0;
}

/* --json: output k as {"index", "shape", "dtype", "values", "file"}. */
static void call_json_output(const call_args *ca, int k, const DLTensor *t, int saved)
{
    printf("%s\n    {\"index\": %d, ", k ? "," : "", k);
    if (t)
        cli_json_tensor_fields(stdout, t, !saved); /* saved: the values are in the file */
    else
        printf("\"shape\": null, \"dtype\": null, \"values\": null");
    printf(", \"file\": ");
    cli_json_opt_str(stdout, saved ? ca->out_paths[k] : NULL);
    printf("}");
}

/* Each output to its --out file, or printed. The exit status. */
static int call_write_outputs(call_state *cs, const call_args *ca)
{
    int rc = CLI_EXIT_OK;
    if (ca->json) {
        printf("{\"op\": ");
        cli_json_str(stdout, cs->info.name);
        printf(", \"device\": ");
        cli_json_str(stdout, ca->device);
        printf(", \"outputs\": [");
    }
    for (int k = 0; k < cs->info.nouts; k++) {
        char err[1024], shape[64 * 24], dbuf[64], label[32];
        const DLTensor *t = cs->outs[k] ? &cs->outs[k]->dl_tensor : NULL;
        if (!t) {
            fprintf(stderr, "opjit: %s: output %d is missing\n", cs->info.name, k);
            rc = CLI_EXIT_FAIL;
            if (ca->json)
                call_json_output(ca, k, NULL, 0);
        } else if (k >= ca->nout_paths) {
            snprintf(label, sizeof label, "output %d", k);
            if (ca->json)
                call_json_output(ca, k, t, 0);
            else
                cli_print_tensor(stdout, label, t);
        } else if (npy_write(ca->out_paths[k], t, err, sizeof err) != 0) {
            fprintf(stderr, "opjit: output %d: %s\n", k, err);
            rc = CLI_EXIT_FAIL;
        } else if (ca->json) {
            call_json_output(ca, k, t, 1);
        } else {
            cli_format_shape(shape, sizeof shape, t);
            printf("output %d: shape %s, dtype %s -> %s\n", k, shape,
                   cli_dtype_name(t->dtype, dbuf, sizeof dbuf), ca->out_paths[k]);
        }
    }
    if (ca->json)
        printf("%s]}\n", cs->info.nouts > 0 ? "\n  " : "");
    return rc;
}

/* Bind, check, run; the exit status. */
static int call_run(call_state *cs, const call_args *ca)
{
    for (int k = 0; k < ca->nassign; k++)
        if (call_bind(cs, ca->assigns[k]) != 0)
            return CLI_EXIT_FAIL;
    if (call_check_missing(cs) != 0)
        return CLI_EXIT_FAIL;
    if (ca->nout_paths > cs->info.nouts) {
        fprintf(stderr, "opjit: %s has %d output%s but %d --out files were given\n",
                cs->info.name, cs->info.nouts, cs->info.nouts == 1 ? "" : "s", ca->nout_paths);
        return CLI_EXIT_FAIL;
    }
    if (strcmp(ca->device, "cuda") == 0 &&
        (call_check_cuda_kernel(cs, ca->opname) != 0 || call_to_cuda(cs) != 0))
        return CLI_EXIT_FAIL;
    if (opjit_call(cs->rt, cs->op, cs->vals, cs->info.nargs, cs->outs, cs->info.nouts) !=
        OPJIT_OK) {
        cli_rt_error(cs->rt, cs->info.name);
        return CLI_EXIT_FAIL;
    }
    if (call_outputs_to_host(cs) != 0)
        return CLI_EXIT_FAIL;
    return call_write_outputs(cs, ca);
}

int cmd_call(int argc, char **argv)
{
    call_args ca = {.device = "cpu"};
    call_state cs;
    int rc = CLI_EXIT_FAIL;
    memset(&cs, 0, sizeof cs);
    ca.assigns = calloc((size_t)argc, sizeof *ca.assigns);
    ca.out_paths = calloc((size_t)argc, sizeof *ca.out_paths);
    if (!ca.assigns || !ca.out_paths)
        fprintf(stderr, "opjit: out of memory\n");
    else if ((rc = parse_call_args(argc, argv, &ca)) == -1)
        rc = call_prepare(&cs, ca.opname) != 0 ? CLI_EXIT_FAIL : call_run(&cs, &ca);
    call_state_free(&cs);
    free(ca.assigns);
    free(ca.out_paths);
    return rc;
}
