/*
 * tools/cmd_warm.c - `opjit warm`: compile operators into the cache ahead of
 * time (opjit_warm), so that a deployment (maybe read-only, maybe offline,
 * maybe without a compiler) only ever hits.
 *
 *   opjit warm [--ops-path DIR] [--cache DIR] [--opt] [--arch LIST] [--remote] [OP|FILE...]
 *
 * Every source is warmed in a runtime of its own, so two directories that
 * both hold an op of one name do not collide, and one failure does not stop
 * the rest.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

static const char warm_help[] =
    "usage: opjit warm [options] [OP|FILE...]\n"
    "\n"
    "Compile operators into the cache: every source on the search path, or the\n"
    "named ops (every source of each name) and files. Prints a summary of cache\n"
    "hits, compiles (naming the compilers whose code was built: tcc, opt,\n"
    "nvrtc) and failures; exits 1 if any source failed, after warming\n"
    "the rest. A source fails too when the cache does not keep what was built\n"
    "(full, read-only, or OPJIT_CACHE_MAX_SIZE too small for all of them).\n"
    "Without NVRTC, .cu sources are skipped, unless --arch or\n"
    "$OPJIT_CUDA_ARCHS asks for device code: then they fail.\n"
    "\n"
    "options:\n"
    "  --opt            also build the optimizing tier (needs a C compiler:\n"
    "                   $OPJIT_CC, else cc), so deployments without one get it\n"
    "  --arch LIST      CUDA architectures to build .cu device code for, comma-\n"
    "                   separated (repeatable): sm_XY makes a cubin, compute_XY\n"
    "                   PTX, e.g. --arch sm_80,sm_90,compute_90 (default:\n"
    "                   $OPJIT_CUDA_ARCHS, else this machine's GPUs, else that list);\n"
    "                   no GPU is needed\n"
    "  --remote         also store every entry warmed, found locally or built, in\n"
    "                   the remote cache ($OPJIT_REMOTE_CACHE) for the fleet\n"
    "  --json           print JSON instead of text: an object with the counts and\n"
    "                   a result per source (no progress bar)\n"
    "  -h, --help       this help\n";

typedef struct warm_args {
    int opt, tty, remote, json, nresults;
    cli_strs targets;
    char archs[1024];
} warm_args;

/* --arch LIST (or --arch=LIST), appended to wa->archs. */
static int add_archs(warm_args *wa, const char *v)
{
    if (!v || !*v) {
        fprintf(stderr, "opjit warm: --arch needs a list such as sm_80,sm_90,compute_90\n");
        return CLI_EXIT_USAGE;
    }
    size_t k = strlen(wa->archs);
    if (cli_check_archs("warm", v) != 0)
        return CLI_EXIT_USAGE;
    if (k + strlen(v) + 2 > sizeof wa->archs) {
        fprintf(stderr, "opjit warm: too many architectures\n");
        return CLI_EXIT_USAGE;
    }
    snprintf(wa->archs + k, sizeof wa->archs - k, "%s%s", k ? "," : "", v);
    return -1;
}

/* argv into wa: -1 to go on, else the exit status to end with. */
static int parse_warm_args(int argc, char **argv, warm_args *wa)
{
    for (int i = 1; i < argc;) {
        int r = cli_common_option(argc, argv, &i);
        if (r == CLI_EXIT_USAGE)
            return r;
        if (r)
            continue;
        const char *a = argv[i++];
        if (cli_is_help(a)) {
            printf("%s\ncommon options:\n%s", warm_help, cli_common_help);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "--opt")) {
            wa->opt = 1;
        } else if (!strcmp(a, "--remote")) {
            wa->remote = 1;
        } else if (!strcmp(a, "--json")) {
            wa->json = 1;
        } else if (!strcmp(a, "--arch") || !strncmp(a, "--arch=", 7)) {
            if ((r = add_archs(wa, a[6] == '=' ? a + 7 : i < argc ? argv[i++] : NULL)) >= 0)
                return r;
        } else if (a[0] == '-') {
            fprintf(stderr, "opjit warm: unknown option %s (see opjit warm --help)\n", a);
            return CLI_EXIT_USAGE;
        } else if (cli_strs_add(&wa->targets, a)) {
            fprintf(stderr, "opjit warm: out of memory\n");
            return CLI_EXIT_FAIL;
        }
    }
    return -1;
}

static void progress_bar(int done, int total, const char *what)
{
    int width = 30, fill = total ? done * width / total : width;
    fprintf(stderr, "\r[%.*s%*s] %d/%d %-40.40s", fill, "##############################",
            width - fill, "", done, total, what);
    fflush(stderr);
}

static const char *const warm_results[] = {"hit", "compiled", "skipped", "failed", "nosource"};

/* One finished source (or a name without one) as a JSON object in the
 * "results" array. */
static void warm_event_json(warm_args *wa, const opjit_warm_event *ev)
{
    int r = ev->result >= 0 && ev->result <= OPJIT_WARM_NOSOURCE ? ev->result : 3;
    printf("%s\n    {\"%s\": ", wa->nresults++ ? "," : "", r == OPJIT_WARM_NOSOURCE ? "op" : "source");
    cli_json_str(stdout, ev->path);
    printf(", \"result\": \"%s\", \"ms\": %.3f, \"compiled\": ", warm_results[r], ev->ms);
    if (r != OPJIT_WARM_COMPILED) {
        printf("[]");
    } else { /* "tcc, opt" as ["tcc", "opt"] */
        printf("[");
        for (const char *p = ev->message; *p;) {
            size_t n = strcspn(p, ",");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)n, p);
            printf("%s", p != ev->message ? ", " : "");
            cli_json_str(stdout, name);
            p += n;
            p += strspn(p, ", ");
        }
        printf("]");
    }
    printf(", \"message\": ");
    cli_json_opt_str(stdout, r == OPJIT_WARM_SKIPPED || r >= OPJIT_WARM_FAILED ? ev->message
                                                                               : NULL);
    printf("}");
}

/* opjit_warm's progress: a bar on a terminal, a line per source. */
static int warm_event(void *ud, const opjit_warm_event *ev)
{
    warm_args *wa = ud;
    if (wa->json) {
        if (ev->done)
            warm_event_json(wa, ev);
        return 0;
    }
    if (ev->result == OPJIT_WARM_NOSOURCE && ev->done) {
        fprintf(stderr, "opjit warm: %s\n", ev->message);
        return 0;
    }
    if (!ev->done) {
        if (wa->tty)
            progress_bar(ev->index, ev->total, ev->path);
        return 0;
    }
    if (wa->tty)
        fprintf(stderr, "\r%*s\r", 80, "");
    if (ev->result == OPJIT_WARM_SKIPPED)
        printf("skipped  %s: %s\n", ev->path, ev->message);
    else if (ev->result == OPJIT_WARM_FAILED)
        fprintf(stderr, "FAILED   %s: %s\n", ev->path, ev->message);
    else if (ev->result == OPJIT_WARM_HIT)
        printf("hit      %s\n", ev->path);
    else /* what it built: its libtcc code, the optimized tier, device code */
        printf("compiled %s (%.1f ms%s%s)\n", ev->path, ev->ms, *ev->message ? ": " : "",
               ev->message);
    fflush(stdout);
    return 0;
}

static void print_summary(const opjit_warm_result *r)
{
    printf("warm: %d sources: %d cache hits, %d compiled, %d failed", r->sources, r->hits,
           r->compiled, r->failed);
    if (r->skipped)
        printf(", %d skipped (no CUDA compiler; --arch makes that a failure)", r->skipped);
    printf(" in %.2f s\n", r->seconds);
}

static void print_summary_json(const opjit_warm_result *r, int ok, const char *error)
{
    printf("%s], \"sources\": %d, \"hits\": %d, \"compiled\": %d, \"failed\": %d, "
           "\"skipped\": %d, \"nosource\": %d, \"seconds\": %.3f, \"ok\": %s, \"error\": ",
           "\n  ", r->sources, r->hits, r->compiled, r->failed, r->skipped, r->nosource,
           r->seconds, ok ? "true" : "false");
    cli_json_opt_str(stdout, error);
    printf("}\n");
}

/* Warm what wa names; the exit status. */
static int warm(warm_args *wa)
{
    opjit_config cfg;
    opjit_runtime *rt;
    cli_config(&cfg);
    cfg.tiering = wa->opt;
    if (wa->archs[0])
        cfg.cuda_archs = wa->archs; /* checked when a .cu is loaded */
    int st = opjit_create(&cfg, &rt);
    if (st) {
        fprintf(stderr, "opjit warm: cannot create the runtime: %s\n", opjit_errstr(st));
        return CLI_EXIT_FAIL;
    }
    opjit_warm_options opts = {.size = sizeof opts,
        .targets = (const char *const *)wa->targets.v, .ntargets = wa->targets.n,
        .opt = wa->opt, .cuda_archs = wa->archs[0] ? wa->archs : NULL, .remote = wa->remote};
    opjit_warm_result res = {.size = sizeof res};
    wa->tty = isatty(2) && !wa->json;
    if (wa->json)
        printf("{\"results\": [");
    st = opjit_warm(rt, &opts, warm_event, wa, &res);
    int general = st && !res.failed && !res.nosource; /* not about one source */
    if (general)
        fprintf(stderr, "opjit warm: %s\n", opjit_errmsg(rt));
    if (wa->json)
        print_summary_json(&res, !st, st ? opjit_errmsg(rt) : NULL);
    else if (!general)
        print_summary(&res);
    opjit_destroy(rt);
    return st ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

int cmd_warm(int argc, char **argv)
{
    warm_args wa;
    memset(&wa, 0, sizeof wa);
    int rc = parse_warm_args(argc, argv, &wa);
    if (rc < 0)
        rc = warm(&wa);
    cli_strs_free(&wa.targets);
    return rc;
}
