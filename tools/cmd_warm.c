/*
 * tools/cmd_warm.c - `opjit warm`: compile operators into the cache ahead of
 * time, so that a deployment (maybe read-only, maybe offline, maybe without
 * a compiler) only ever hits.
 *
 *   opjit warm [--ops-path DIR] [--cache DIR] [--opt] [--arch LIST] [OP|FILE...]
 *
 * Every source is warmed in a runtime of its own, so two directories that
 * both hold an op of one name do not collide, and one failure does not stop
 * the rest.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loader/loader.h"
#include "tools/commands.h"

static const char warm_help[] =
    "usage: opjit warm [options] [OP|FILE...]\n"
    "\n"
    "Compile operators into the cache: every source on the search path, or the\n"
    "named ops (every source of each name) and files. Prints a summary of cache\n"
    "hits, compiles and failures; exits 1 if any source failed, after warming\n"
    "the rest. Without NVRTC, .cu sources are skipped, unless --arch or\n"
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
    "  -h, --help       this help\n";

typedef struct list {
    char **v;
    int n, cap;
} list;

static int list_add(list *l, const char *s)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], s))
            return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s)))
        return -1;
    l->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_source(const char *name)
{
    size_t n = strlen(name);
    return (n > 2 && !strcmp(name + n - 2, ".c")) || (n > 3 && !strcmp(name + n - 3, ".cu"));
}

/* Every source file in every directory of the search path. */
static int all_sources(const char *path, list *out)
{
    const char *p = path;
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char dir[4096];
        snprintf(dir, sizeof dir, "%.*s", (int)n, p);
        DIR *d = n ? opendir(dir) : NULL;
        if (d) {
            int first = out->n;
            struct dirent *de;
            while ((de = readdir(d)))
                if (de->d_name[0] != '.' && is_source(de->d_name)) {
                    char f[8192];
                    snprintf(f, sizeof f, "%s/%s", dir, de->d_name);
                    if (list_add(out, f))
                        return -1;
                }
            closedir(d);
            qsort(out->v + first, (size_t)(out->n - first), sizeof *out->v, cmp_str);
        }
        p += n + (e ? 1 : 0);
    }
    return 0;
}

static int add_path(void *ud, const char *path) { return list_add(ud, path) ? 1 : 0; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void progress(int done, int total, const char *what)
{
    int width = 30, fill = total ? done * width / total : width;
    fprintf(stderr, "\r[%.*s%*s] %d/%d %-40.40s", fill, "##############################",
            width - fill, "", done, total, what);
    fflush(stderr);
}

int opjit_cmd_warm(int argc, char **argv)
{
    int opt = 0;
    list targets = {0}, files = {0};
    char archs[1024] = "";
    for (int i = 1; i < argc;) {
        int r = opjit_cli_common_option(argc, argv, &i);
        if (r == OPJIT_EXIT_USAGE)
            return r;
        if (r)
            continue;
        const char *a = argv[i++];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\ncommon options:\n%s", warm_help, opjit_cli_common_help);
            return OPJIT_EXIT_OK;
        } else if (!strcmp(a, "--opt")) {
            opt = 1;
        } else if (!strcmp(a, "--arch") || !strncmp(a, "--arch=", 7)) {
            const char *v = a[6] == '=' ? a + 7 : (i < argc ? argv[i++] : NULL);
            if (!v || !*v) {
                fprintf(stderr, "opjit warm: --arch needs a list such as sm_80,sm_90,compute_90\n");
                return OPJIT_EXIT_USAGE;
            }
            size_t k = strlen(archs);
            if (k + strlen(v) + 2 > sizeof archs) {
                fprintf(stderr, "opjit warm: too many architectures\n");
                return OPJIT_EXIT_USAGE;
            }
            snprintf(archs + k, sizeof archs - k, "%s%s", k ? "," : "", v);
        } else if (a[0] == '-') {
            fprintf(stderr, "opjit warm: unknown option %s (see opjit warm --help)\n", a);
            return OPJIT_EXIT_USAGE;
        } else if (list_add(&targets, a)) {
            fprintf(stderr, "opjit warm: out of memory\n");
            return OPJIT_EXIT_FAIL;
        }
    }

    opjit_config cfg;
    opjit_cli_config(&cfg);
    cfg.tiering = opt;
    if (archs[0])
        cfg.cuda_archs = archs; /* checked when a .cu is loaded */
    opjit_runtime *rt;
    int st = opjit_create(&cfg, &rt);
    if (st) {
        fprintf(stderr, "opjit warm: cannot create the runtime: %s\n", opjit_errstr(st));
        return OPJIT_EXIT_FAIL;
    }
    int rc = OPJIT_EXIT_OK;
    if (!targets.n) {
        all_sources(loader_ops_path(rt), &files);
    } else {
        for (int i = 0; i < targets.n; i++) {
            const char *t = targets.v[i];
            if (strchr(t, '/') || is_source(t)) {
                list_add(&files, t);
                continue;
            }
            int before = files.n;
            loader_each_source(rt, t, add_path, &files);
            if (files.n == before) {
                fprintf(stderr, "opjit warm: no source for op '%s' on the search path (%s)\n", t,
                        loader_ops_path(rt));
                rc = OPJIT_EXIT_FAIL;
            }
        }
    }
    opjit_destroy(rt);

    /* Without NVRTC, .cu sources are skipped like loads by name skip them,
     * unless architectures were asked for: then it is a failure. */
    const char *env_archs = getenv("OPJIT_CUDA_ARCHS");
    int cuda_wanted = archs[0] || (env_archs && *env_archs);
    int tty = isatty(2), hits = 0, compiled = 0, failed = 0, skipped = 0;
    double t0 = now_s();
    for (int i = 0; i < files.n; i++) {
        const char *f = files.v[i];
        if (tty)
            progress(i, files.n, f);
        opjit_load_info info;
        double t1 = now_s();
        int s = opjit_create(&cfg, &rt);
        if (!s)
            s = opjit_load_file(rt, f, NULL, &info);
        if (!s && opt)
            s = opjit_wait(rt);
        if (tty)
            fprintf(stderr, "\r%*s\r", 80, "");
        size_t flen = strlen(f);
        if (s == OPJIT_EDEVICE && !cuda_wanted && flen > 3 && !strcmp(f + flen - 3, ".cu")) {
            skipped++;
            printf("skipped  %s: %s\n", f, opjit_errmsg(rt));
        } else if (s) {
            failed++;
            fprintf(stderr, "FAILED   %s: %s\n", f, rt ? opjit_errmsg(rt) : opjit_errstr(s));
        } else if (info.cache_hit && !opt) {
            hits++;
            printf("hit      %s\n", f);
        } else {
            if (info.cache_hit)
                hits++;
            else
                compiled++;
            printf("%-8s %s (%.1f ms%s)\n", info.cache_hit ? "hit" : "compiled", f,
                   (now_s() - t1) * 1e3, opt ? ", optimized tier too" : "");
        }
        fflush(stdout);
        opjit_destroy(rt);
        rt = NULL;
    }
    printf("warm: %d sources: %d cache hits, %d compiled, %d failed", files.n, hits, compiled,
           failed);
    if (skipped)
        printf(", %d skipped (no CUDA compiler; --arch makes that a failure)", skipped);
    printf(" in %.2f s\n", now_s() - t0);
    for (int i = 0; i < targets.n; i++)
        free(targets.v[i]);
    for (int i = 0; i < files.n; i++)
        free(files.v[i]);
    free(targets.v);
    free(files.v);
    return failed ? OPJIT_EXIT_FAIL : rc;
}
