/* tests/test_cuda.c - CUDA operators on every machine, GPU or not:
 * NVRTC compiles every shipped .cu to cubins and PTX; device-code errors
 * carry file:line; the cache keeps one entry per architecture and reuses
 * them; a missing NVRTC or driver gives a clear error while CPU ops keep
 * working; a .c and a .cu of one op must declare the same schema.
 *
 * Runs on the GPU (every CUDA op against its CPU twin) live in
 * tests/test_cuda_gpu.c, which skips where no GPU is.
 *
 * Scenarios that need another process environment (no NVRTC) re-run this
 * program with an argument: NVRTC, once loaded, stays loaded. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit/jit.h"
#include "opjit.h"
#include "runtime/cuda.h"
#include "t.h"

/* ---- helpers ------------------------------------------------------------------ */

#define MAX_TMP 64
static char *tmp_dirs[MAX_TMP];
static int ntmp;
static const char *self_exe;

static const char *tmpdir_new(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/opjit-test-cuda-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    if (!d || ntmp == MAX_TMP) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    return tmp_dirs[ntmp++] = strdup(d);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(p);
    return 0;
}

static void tmpdirs_remove(void)
{
    for (int i = 0; i < ntmp; i++) {
        nftw(tmp_dirs[i], rm_one, 16, FTW_DEPTH | FTW_PHYS);
        free(tmp_dirs[i]);
    }
    ntmp = 0;
}

static const char *pjoin(const char *dir, const char *name)
{
    static char bufs[32][1024];
    static int i;
    char *b = bufs[i++ % 32];
    snprintf(b, 1024, "%s/%s", dir, name);
    return b;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECKF(f != NULL, "fopen %s: %s", path, strerror(errno));
    if (!f)
        return;
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

static const char *ops_dir(void)
{
    static char d[1024];
    const char *src = getenv("OPJIT_SOURCE_DIR");
    snprintf(d, sizeof d, "%s/ops-src", src ? src : ".");
    return d;
}

static opjit_runtime *rt_new(const char *cache, const char *archs)
{
    opjit_config cfg;
    opjit_config_init(&cfg);
    cfg.cache_dir = cache;
    cfg.cuda_archs = archs;
    cfg.tiering = 0;
    cfg.ops_path = ops_dir();
    opjit_runtime *rt = NULL;
    int rc = opjit_create(&cfg, &rt);
    CHECKF(rc == OPJIT_OK && rt, "opjit_create: %s", opjit_status_name(rc));
    return rt;
}

/* Every file under dir whose name is name, counted. */
static int count_named(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st))
            continue;
        if (S_ISDIR(st.st_mode))
            n += count_named(p, name);
        else if (!strcmp(e->d_name, name))
            n++;
    }
    closedir(d);
    return n;
}

static int nvrtc_here(void)
{
    char err[4096];
    int rc = jit_nvrtc_load(err, sizeof err);
    if (rc)
        fprintf(stderr, "note: no NVRTC here (%s): its checks are skipped\n", err);
    return rc == OPJIT_OK;
}

static int gpu_here(void) { return cuda_available(NULL, 0) == OPJIT_OK; }

/* Run this program again with mode as argv[1] and env ("NAME=VALUE" or
 * "NAME" to unset) applied; returns its exit status. */
static int run_child(const char *mode, const char *const *env)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        for (const char *const *e = env; e && *e; e++) {
            const char *eq = strchr(*e, '=');
            if (eq) {
                char name[256];
                snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
                setenv(name, eq + 1, 1);
            } else {
                unsetenv(*e);
            }
        }
        execl(self_exe, self_exe, mode, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A DLTensor on device (kDLCPU or kDLCUDA, 0) over data. */
static DLTensor tensor(void *data, int dltype, DLDataType dt, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = dltype;
    t.device.device_id = 0;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

static const char *const shipped[] = {"nms.cu", "mm.cu", "conv2d.cu", NULL};

/* ---- NVRTC ---------------------------------------------------------------------- */

static void nvrtc_compiles_every_shipped_op(void)
{
    if (!nvrtc_here())
        return;
    CHECK(jit_nvrtc_identity() && strstr(jit_nvrtc_identity(), "nvrtc "));
    const char *d = tmpdir_new();
    static const char *const archs[] = {"sm_80", "sm_90", "compute_90", NULL};
    for (int i = 0; shipped[i]; i++) {
        size_t len;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", ops_dir(), shipped[i]);
        FILE *f = fopen(path, "rb");
        CHECKF(f != NULL, "%s: %s", path, strerror(errno));
        if (!f)
            continue;
        static char text[1 << 20];
        len = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[len] = '\0';
        for (int a = 0; archs[a]; a++) {
            char out[1024], diag[8192];
            snprintf(out, sizeof out, "%s/%s.%s", d, shipped[i], archs[a]);
            jit_nvrtc_job job = {.source_name = shipped[i], .text = text, .arch = archs[a],
                                 .out_path = out};
            int rc = jit_nvrtc_compile(&job, diag, sizeof diag);
            CHECKF(rc == OPJIT_OK, "%s for %s: %s", shipped[i], archs[a], diag);
            char head[4096] = "";
            FILE *g = fopen(out, "rb");
            size_t got = g ? fread(head, 1, sizeof head - 1, g) : 0;
            if (g)
                fclose(g);
            head[got] = '\0';
            if (!strncmp(archs[a], "sm_", 3)) {
                CHECKF(got > 4 && !memcmp(head, "\177ELF", 4), "%s: not a cubin", out);
            } else {
                CHECKF(strstr(head, ".version") && strstr(head, ".target sm_90"),
                       "%s: not PTX for sm_90: %.200s", out, head);
            }
        }
    }
}

static void device_errors_carry_file_and_line(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    const char *src = pjoin(d, "qcu_bad.cu");
    write_text(src, "#ifdef __CUDACC_RTC__\n"
                    "extern \"C\" __global__ void k(float *x)\n"
                    "{\n"
                    "    x[threadIdx.x] = undeclared_thing;\n"
                    "}\n"
                    "#else\n"
                    "#include <opjit_op.h>\n"
                    "static int f(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
                    "OPJIT_MODULE(qcu_bad, m) { opjit_def(m, \"qcu_bad(Tensor x) -> Tensor\", "
                    "OPJIT_CUDA, f, \"\"); }\n"
                    "#endif\n");
    opjit_runtime *rt = rt_new(pjoin(d, "cache"), "sm_90");
    int rc = opjit_load_file(rt, src, NULL, NULL);
    CHECKF(rc == OPJIT_ECOMPILE, "got %s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qcu_bad.cu:4:");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "undeclared_thing");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "sm_90");

    /* The host half's errors come from libtcc, also with file:line; it
     * must not see __CUDACC_RTC__. */
    const char *src2 = pjoin(d, "qcu_badhost.cu");
    write_text(src2, "#ifdef __CUDACC_RTC__\n"
                     "extern \"C\" __global__ void k(float *x) { x[0] = 1; }\n"
                     "#else\n"
                     "#include <opjit_op.h>\n"
                     "int broken(void) { return nope; }\n"
                     "#endif\n");
    rc = opjit_load_file(rt, src2, NULL, NULL);
    CHECKF(rc == OPJIT_ECOMPILE, "got %s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qcu_badhost.cu:5:");
    opjit_destroy(rt);
}

/* ---- the cache: one entry per architecture ------------------------------------------ */

static void cache_keeps_each_arch(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    const char *cache = pjoin(d, "cache");
    char nms[1024];
    snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());

    opjit_runtime *rt = rt_new(cache, "sm_80,sm_90,compute_90");
    opjit_load_info info;
    opjit_op *op = NULL;
    int rc = opjit_load_file(rt, nms, &op, &info);
    CHECKF(rc == OPJIT_OK && op, "load nms.cu: %s", opjit_errmsg(rt));
    CHECK(!info.cache_hit && info.compile_ms > 0);
    CHECK(!strcmp(info.tier, "nvrtc"));
    opjit_op_info oi;
    if (op && opjit_op_info_get(rt, op, &oi) == OPJIT_OK) {
        CHECK(oi.source[OPJIT_CUDA] && strstr(oi.source[OPJIT_CUDA], "nms.cu"));
        CHECK(oi.tier[OPJIT_CUDA] && !strcmp(oi.tier[OPJIT_CUDA], "nvrtc"));
    }
    opjit_destroy(rt);
    CHECK(count_named(cache, "sm_80.cubin") == 1);
    CHECK(count_named(cache, "sm_90.cubin") == 1);
    CHECK(count_named(cache, "compute_90.ptx") == 1);
    CHECK(count_named(cache, "host.so") == 1);

    /* Another process-like runtime: all hits, nothing compiled. */
    rt = rt_new(cache, "sm_80,sm_90,compute_90");
    rc = opjit_load_file(rt, nms, NULL, &info);
    CHECKF(rc == OPJIT_OK, "reload: %s", opjit_errmsg(rt));
    CHECK(info.cache_hit == 1 && info.compile_ms == 0);
    opjit_destroy(rt);

    /* A subset is all hits; one more arch compiles that arch only. */
    rt = rt_new(cache, "sm_90");
    rc = opjit_load_file(rt, nms, NULL, &info);
    CHECK(rc == OPJIT_OK && info.cache_hit == 1);
    opjit_destroy(rt);
    rt = rt_new(cache, "sm_90, sm_86");
    rc = opjit_load_file(rt, nms, NULL, &info);
    CHECKF(rc == OPJIT_OK, "sm_86: %s", opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    opjit_destroy(rt);
    CHECK(count_named(cache, "sm_86.cubin") == 1);
    CHECK(count_named(cache, "sm_90.cubin") == 1);
    CHECK(count_named(cache, "host.so") == 1);

    /* OPJIT_CUDA_ARCHS when the config says nothing. */
    setenv("OPJIT_CUDA_ARCHS", "compute_80", 1);
    rt = rt_new(cache, NULL);
    rc = opjit_load_file(rt, nms, NULL, &info);
    CHECKF(rc == OPJIT_OK, "compute_80: %s", opjit_errmsg(rt));
    opjit_destroy(rt);
    unsetenv("OPJIT_CUDA_ARCHS");
    CHECK(count_named(cache, "compute_80.ptx") == 1);

    /* A bad list is refused, naming where it came from. */
    rt = rt_new(cache, "sm_90,sm_9x");
    rc = opjit_load_file(rt, nms, NULL, NULL);
    CHECK(rc == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "sm_9x");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "cuda_archs");
    opjit_destroy(rt);
}

static void default_archs_without_gpu(void)
{
    if (!nvrtc_here() || gpu_here())
        return;
    const char *d = tmpdir_new();
    const char *cache = pjoin(d, "cache");
    char mm[1024];
    snprintf(mm, sizeof mm, "%s/mm.cu", ops_dir());
    unsetenv("OPJIT_CUDA_ARCHS");
    opjit_runtime *rt = rt_new(cache, NULL);
    int rc = opjit_load_file(rt, mm, NULL, NULL);
    CHECKF(rc == OPJIT_OK, "mm.cu: %s", opjit_errmsg(rt));
    opjit_destroy(rt);
    CHECK(count_named(cache, "sm_80.cubin") == 1);
    CHECK(count_named(cache, "sm_90.cubin") == 1);
    CHECK(count_named(cache, "compute_90.ptx") == 1);
}

/* ---- every shipped .cu loads beside its CPU twin ---------------------------------------- */

static void shipped_ops_load_beside_their_twins(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    opjit_runtime *rt = rt_new(pjoin(d, "cache"), "sm_90");
    for (int i = 0; shipped[i]; i++) {
        char cu[1024], c[1024];
        snprintf(cu, sizeof cu, "%s/%s", ops_dir(), shipped[i]);
        snprintf(c, sizeof c, "%s/%.*s.c", ops_dir(), (int)(strlen(shipped[i]) - 3), shipped[i]);
        opjit_op *a = NULL, *b = NULL;
        int rc = opjit_load_file(rt, c, &a, NULL);
        CHECKF(rc == OPJIT_OK, "%s: %s", c, opjit_errmsg(rt));
        rc = opjit_load_file(rt, cu, &b, NULL);
        CHECKF(rc == OPJIT_OK, "%s: %s", cu, opjit_errmsg(rt));
        CHECK(a && a == b);
        opjit_op_info oi;
        if (b && opjit_op_info_get(rt, b, &oi) == OPJIT_OK) {
            CHECK(oi.source[OPJIT_CPU] && oi.source[OPJIT_CUDA]);
            CHECK(oi.doc[OPJIT_CUDA] && strstr(oi.doc[OPJIT_CUDA], "CUDA"));
        }
        /* Unchanged: a second load is a no-op. */
        opjit_load_info info;
        rc = opjit_load_file(rt, cu, NULL, &info);
        CHECK(rc == OPJIT_OK && info.cache_hit);
    }
    opjit_destroy(rt);
}

static void schema_mismatch_names_both_files(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    write_text(pjoin(d, "qcu_twin.c"),
               "#include <opjit_op.h>\n"
               "static int f(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
               "OPJIT_MODULE(qcu_twin, m) { opjit_def(m, \"qcu_twin(Tensor x) -> Tensor\", "
               "OPJIT_CPU, f, \"\"); }\n");
    write_text(pjoin(d, "qcu_twin.cu"),
               "#ifdef __CUDACC_RTC__\n"
               "extern \"C\" __global__ void k(float *x) { x[0] = 1; }\n"
               "#else\n"
               "#include <opjit_op.h>\n"
               "static int f(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
               "OPJIT_MODULE(qcu_twin, m) { opjit_def(m, \"qcu_twin(Tensor x, int k=1) -> "
               "Tensor\", OPJIT_CUDA, f, \"\"); }\n"
               "#endif\n");
    opjit_runtime *rt = rt_new(pjoin(d, "cache"), "sm_90");
    int rc = opjit_load_file(rt, pjoin(d, "qcu_twin.c"), NULL, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    rc = opjit_load_file(rt, pjoin(d, "qcu_twin.cu"), NULL, NULL);
    CHECK(rc == OPJIT_ESCHEMA);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qcu_twin.c ");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qcu_twin.cu");
    opjit_destroy(rt);

    /* A .cu may register CUDA kernels only. */
    write_text(pjoin(d, "qcu_cpu.cu"),
               "#ifndef __CUDACC_RTC__\n"
               "#include <opjit_op.h>\n"
               "static int f(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
               "OPJIT_MODULE(qcu_cpu, m) { opjit_def(m, \"qcu_cpu(Tensor x) -> Tensor\", "
               "OPJIT_CPU, f, \"\"); }\n"
               "#endif\n");
    rt = rt_new(pjoin(d, "cache"), "sm_90");
    rc = opjit_load_file(rt, pjoin(d, "qcu_cpu.cu"), NULL, NULL);
    CHECK(rc == OPJIT_EMODULE);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), ".cu source can only register cuda kernels");
    opjit_destroy(rt);
}

/* ---- no driver, no device ----------------------------------------------------------- */

static void cuda_call_without_driver_fails_cleanly(void)
{
    if (gpu_here()) {
        fprintf(stderr, "note: a GPU is here; the no-driver checks are skipped\n");
        return;
    }
    if (!nvrtc_here())
        return;
    char why[1024] = "";
    CHECK(cuda_available(why, sizeof why) == OPJIT_EDEVICE);
    CHECKF(strstr(why, "no libcuda.so.1") || strstr(why, "no CUDA device"), "%s", why);

    const char *d = tmpdir_new();
    opjit_runtime *rt = rt_new(pjoin(d, "cache"), "sm_90");
    /* Handing over a stream does no CUDA work. */
    CHECK(opjit_set_cuda_stream(rt, 0, NULL, NULL) == OPJIT_OK);
    CHECK(opjit_set_cuda_stream(rt, -1, NULL, NULL) == OPJIT_EINVAL);
    char nms[1024];
    snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());
    opjit_op *op = NULL;
    int rc = opjit_load_file(rt, nms, &op, NULL);
    CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
    float boxes[8] = {0, 0, 1, 1, 0, 0, 1, 1}, scores[2] = {1, 2};
    int64_t bs[2] = {2, 4}, ss[1] = {2};
    DLTensor b = tensor((void *)(uintptr_t)0x100000, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, bs);
    DLTensor s = tensor((void *)(uintptr_t)0x200000, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 1, ss);
    opjit_value args[3] = {opjit_tensor(&b), opjit_tensor(&s), opjit_float(0.5)};
    DLManagedTensor *out = NULL;
    rc = opjit_call(rt, op, args, 3, &out, 1);
    CHECK(rc == OPJIT_EDEVICE && out == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), why);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "nms");

    /* The CPU twin still works, in the same runtime. */
    char nmsc[1024];
    snprintf(nmsc, sizeof nmsc, "%s/nms.c", ops_dir());
    rc = opjit_load_file(rt, nmsc, NULL, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    b = tensor(boxes, kDLCPU, (DLDataType){kDLFloat, 32, 1}, 2, bs);
    s = tensor(scores, kDLCPU, (DLDataType){kDLFloat, 32, 1}, 1, ss);
    rc = opjit_call(rt, op, args, 3, &out, 1);
    CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
    if (out) {
        CHECK(out->dl_tensor.shape[0] == 1 && ((int64_t *)out->dl_tensor.data)[0] == 1);
        out->deleter(out);
    }
    opjit_destroy(rt);
}

static void by_name_loads_cpu_only_without_cuda(void)
{
    if (gpu_here())
        return;
    const char *d = tmpdir_new();
    opjit_runtime *rt = rt_new(pjoin(d, "cache"), NULL);
    for (int i = 0; shipped[i]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(shipped[i]) - 3), shipped[i]);
        opjit_op *op = NULL;
        int rc = opjit_load_op(rt, name, &op);
        CHECKF(rc == OPJIT_OK && op, "%s: %s", name, opjit_errmsg(rt));
        opjit_op_info oi;
        if (op && opjit_op_info_get(rt, op, &oi) == OPJIT_OK) {
            CHECK(oi.source[OPJIT_CPU] != NULL);
            CHECKF(oi.source[OPJIT_CUDA] == NULL, "%s: the .cu was loaded", name);
        }
    }
    opjit_destroy(rt);
    /* Nothing was compiled for CUDA. */
    CHECK(count_named(pjoin(d, "cache"), "sm_90.cubin") == 0);
}

/* ---- no NVRTC (in a child process) ---------------------------------------------------- */

/* Child: NVRTC cannot be found. A .cu load says so; CPU ops still work; a
 * cache warmed elsewhere still serves the device code. */
static int child_no_nvrtc(void)
{
    const char *cache = getenv("QCU_CACHE"), *warm = getenv("QCU_WARM_CACHE");
    char err[4096];
    CHECK(jit_nvrtc_load(err, sizeof err) == OPJIT_EDEVICE);
    CHECK_STR_CONTAINS(err, "NVRTC");
    CHECK_STR_CONTAINS(err, "/nonexistent/libnvrtc.so.13");

    char nms[1024], nmsc[1024];
    snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());
    snprintf(nmsc, sizeof nmsc, "%s/nms.c", ops_dir());
    opjit_runtime *rt = rt_new(cache, "sm_90");
    int rc = opjit_load_file(rt, nms, NULL, NULL);
    CHECKF(rc == OPJIT_EDEVICE, "got %s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "nms.cu");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "no NVRTC library");
    opjit_op *op = NULL;
    rc = opjit_load_file(rt, nmsc, &op, NULL);
    CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
    float boxes[8] = {0, 0, 1, 1, 0, 0, 1, 1}, scores[2] = {1, 2};
    int64_t bs[2] = {2, 4}, ss[1] = {2};
    DLTensor b = tensor(boxes, kDLCPU, (DLDataType){kDLFloat, 32, 1}, 2, bs);
    DLTensor s = tensor(scores, kDLCPU, (DLDataType){kDLFloat, 32, 1}, 1, ss);
    opjit_value args[3] = {opjit_tensor(&b), opjit_tensor(&s), opjit_float(0.5)};
    DLManagedTensor *out = NULL;
    rc = opjit_call(rt, op, args, 3, &out, 1);
    CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
    if (out) {
        CHECK(out->dl_tensor.shape[0] == 1 && ((int64_t *)out->dl_tensor.data)[0] == 1);
        out->deleter(out);
    }
    /* By name: the CPU source, whatever CUDA is here. */
    rc = opjit_load_op(rt, "nms", &op);
    CHECKF(rc == OPJIT_OK, "by name: %s", opjit_errmsg(rt));
    opjit_destroy(rt);

    /* Device code warmed by a machine with NVRTC is found without it. */
    if (warm) {
        rt = rt_new(warm, "sm_90,compute_90");
        opjit_load_info info;
        rc = opjit_load_file(rt, nms, NULL, &info);
        CHECKF(rc == OPJIT_OK && info.cache_hit, "from the warmed cache: %s", opjit_errmsg(rt));
        opjit_destroy(rt);
        /* ... but not an architecture nobody warmed. */
        rt = rt_new(warm, "sm_75");
        rc = opjit_load_file(rt, nms, NULL, NULL);
        CHECK(rc == OPJIT_EDEVICE);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "sm_75");
        opjit_destroy(rt);
    }
    tmpdirs_remove();
    return t_failed_checks ? 1 : 0;
}

static void missing_nvrtc_is_a_clear_error(void)
{
    const char *d = tmpdir_new();
    const char *empty = pjoin(d, "empty-cuda");
    mkdir(empty, 0700);
    char cache[1024], warm[1024], home[1024];
    snprintf(cache, sizeof cache, "QCU_CACHE=%s/cache", d);
    snprintf(warm, sizeof warm, "%s/warm", d);
    snprintf(home, sizeof home, "CUDA_HOME=%s", empty);
    char warm_env[1100] = "QCU_WARM";
    if (nvrtc_here()) {
        /* Warm a cache here, with NVRTC, for the child to use without. */
        opjit_runtime *rt = rt_new(warm, "sm_90,compute_90");
        char nms[1024];
        snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());
        int rc = opjit_load_file(rt, nms, NULL, NULL);
        CHECKF(rc == OPJIT_OK, "warm: %s", opjit_errmsg(rt));
        opjit_destroy(rt);
        snprintf(warm_env, sizeof warm_env, "QCU_WARM_CACHE=%s", warm);
    }
    const char *env[] = {"OPJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so.13", home, "CUDA_PATH",
                         cache, warm_env, NULL};
    int st = run_child("--child-no-nvrtc", env);
    CHECKF(st == 0, "the child without NVRTC exited %d", st);
}

int main(int argc, char **argv)
{
    self_exe = argv[0][0] == '/' ? argv[0] : realpath(argv[0], NULL);
    if (argc > 1 && !strcmp(argv[1], "--child-no-nvrtc"))
        return child_no_nvrtc();
    T_RUN(nvrtc_compiles_every_shipped_op);
    T_RUN(device_errors_carry_file_and_line);
    T_RUN(cache_keeps_each_arch);
    T_RUN(default_archs_without_gpu);
    T_RUN(shipped_ops_load_beside_their_twins);
    T_RUN(schema_mismatch_names_both_files);
    T_RUN(cuda_call_without_driver_fails_cleanly);
    T_RUN(by_name_loads_cpu_only_without_cuda);
    T_RUN(missing_nvrtc_is_a_clear_error);
    tmpdirs_remove();
    if (self_exe != argv[0])
        free((void *)self_exe);
    return t_done();
}
