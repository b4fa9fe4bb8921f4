/* tests/test_cuda.c - CUDA operators on every machine, GPU or not:
 * NVRTC compiles every shipped .cu to cubins and PTX; device-code errors
 * carry file:line; the cache keeps one entry per architecture and reuses
 * them; a missing NVRTC or driver gives a clear error while CPU ops keep
 * working; a .c and a .cu of one op must declare the same schema.
 *
 * The CUDA path itself (driver loading, contexts, image choice, outputs,
 * copies, workspaces, the host halves of the shipped ops, every error on
 * the way) runs against tests/fake_libcuda.c, a stand-in driver built here
 * with $OPJIT_CC whose "kernels" are serial C emulations: the CUDA device
 * code is not executed. Runs on a real GPU (every CUDA op against its CPU
 * twin) live in tests/test_cuda_gpu.c, which skips where no GPU is.
 *
 * Scenarios that need another process environment (no NVRTC, cuBLAS or
 * not) re-run this program with an argument: NVRTC and cuBLAS, once
 * loaded, stay loaded. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
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
#include "t_files.h"

/* ---- helpers ------------------------------------------------------------------ */

static const char *self_exe;
static const char *tmpdir_new(void) { return t_tmpdir("cuda"); }
#define pjoin t_path
#define tmpdirs_remove t_tmpdirs_remove

static void write_text(const char *path, const char *text) { t_write(path, text, strlen(text)); }

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
    opjit_config_init(&cfg, sizeof cfg);
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
        char path[2048];
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
            /* named by path, as the loader names it: NVRTC finds the local
             * headers of the device half (half_wide_cuda.h) beside it */
            jit_nvrtc_job job = {.source_name = path, .text = text, .arch = archs[a],
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
    char nms[2048];
    snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());

    opjit_runtime *rt = rt_new(cache, "sm_80,sm_90,compute_90");
    opjit_load_info info = {.size = sizeof info};
    opjit_op *op = NULL;
    int rc = opjit_load_file(rt, nms, &op, &info);
    CHECKF(rc == OPJIT_OK && op, "load nms.cu: %s", opjit_errmsg(rt));
    CHECK(!info.cache_hit && info.compile_ms > 0);
    CHECK(!strcmp(info.tier, "nvrtc"));
    opjit_op_info oi = {.size = sizeof oi};
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
    char mm[2048];
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
        char cu[2048], c[2048];
        snprintf(cu, sizeof cu, "%s/%s", ops_dir(), shipped[i]);
        snprintf(c, sizeof c, "%s/%.*s.c", ops_dir(), (int)(strlen(shipped[i]) - 3), shipped[i]);
        opjit_op *a = NULL, *b = NULL;
        int rc = opjit_load_file(rt, c, &a, NULL);
        CHECKF(rc == OPJIT_OK, "%s: %s", c, opjit_errmsg(rt));
        rc = opjit_load_file(rt, cu, &b, NULL);
        CHECKF(rc == OPJIT_OK, "%s: %s", cu, opjit_errmsg(rt));
        CHECK(a && a == b);
        opjit_op_info oi = {.size = sizeof oi};
        if (b && opjit_op_info_get(rt, b, &oi) == OPJIT_OK) {
            CHECK(oi.source[OPJIT_CPU] && oi.source[OPJIT_CUDA]);
            CHECK(oi.doc[OPJIT_CUDA] && strstr(oi.doc[OPJIT_CUDA], "CUDA"));
        }
        /* Unchanged: a second load is a no-op. */
        opjit_load_info info = {.size = sizeof info};
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
    char nms[2048];
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
    char nmsc[2048];
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
        opjit_op_info oi = {.size = sizeof oi};
        if (op && opjit_op_info_get(rt, op, &oi) == OPJIT_OK) {
            CHECK(oi.source[OPJIT_CPU] != NULL);
            CHECKF(oi.source[OPJIT_CUDA] == NULL, "%s: the .cu was loaded", name);
        }
    }
    opjit_destroy(rt);
    /* Nothing was compiled for CUDA. */
    CHECK(count_named(pjoin(d, "cache"), "sm_90.cubin") == 0);
}

/* ---- a warm cache never loads NVRTC ------------------------------------------------------ */

static int child_warm_hit(void)
{
    char nms[2048];
    snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());
    opjit_runtime *rt = rt_new(getenv("QCU_CACHE"), "sm_80,compute_90");
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, nms, NULL, &info);
    CHECKF(rc == OPJIT_OK && info.cache_hit, "%s", opjit_errmsg(rt));
    CHECKF(jit_nvrtc_identity() == NULL, "NVRTC was loaded for a cache hit");
    opjit_destroy(rt);
    return t_failed_checks ? 1 : 0;
}

static void warm_hits_do_not_load_nvrtc(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    char cache[1100], nms[2048];
    snprintf(nms, sizeof nms, "%s/nms.cu", ops_dir());
    opjit_runtime *rt = rt_new(pjoin(d, "cache"), "sm_80,compute_90");
    int rc = opjit_load_file(rt, nms, NULL, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    opjit_destroy(rt);
    snprintf(cache, sizeof cache, "QCU_CACHE=%s/cache", d);
    const char *env[] = {cache, NULL};
    CHECK(run_child("--child-warm-hit", env) == 0);
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

    char nms[2048], nmsc[1024];
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
        opjit_load_info info = {.size = sizeof info};
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
        char nms[2048];
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


/* ---- host halves that call cuBLAS directly ------------------------------------------- */

/* Child: a host half that links cuBLAS (libtcc binds its symbols at
 * dlopen). QCU_EXPECT=load: it loads where cuBLAS is, GPU or not (the
 * loader makes libcublas global first, or after the first dlopen names a
 * missing cublas symbol); =error: $OPJIT_CUBLAS_LIBRARY names no file and
 * the error says why. */
static int child_cublas_direct(void)
{
    const char *expect = getenv("QCU_EXPECT");
    const char *d = tmpdir_new();
    const char *src = pjoin(d, "qcu_cublas.cu");
    write_text(src, "#ifdef __CUDACC_RTC__\n"
                    "extern \"C\" __global__ void qcu_cublas_k(float *x) { x[0] = 1; }\n"
                    "#else\n"
                    "#include <opjit_op.h>\n"
                    "int cublasCreate_v2(void **handle);\n"
                    "static int f(opjit_ctx *c, opjit_args *a)\n"
                    "{\n"
                    "    void *h;\n"
                    "    (void)a;\n"
                    "    return cublasCreate_v2(&h) ? opjit_fail(c, \"no handle\") : 0;\n"
                    "}\n"
                    "OPJIT_MODULE(qcu_cublas, m) { opjit_def(m, \"qcu_cublas(Tensor x) -> "
                    "Tensor\", OPJIT_CUDA, f, \"\"); }\n"
                    "#endif\n");
    opjit_runtime *rt = rt_new(getenv("QCU_CACHE"), "sm_90");
    int rc = opjit_load_file(rt, src, NULL, NULL);
    if (!strcmp(expect, "error")) {
        CHECK(rc == OPJIT_EMODULE);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "cublasCreate_v2");
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "(cuBLAS: cannot load /nonexistent/libcublas.so.13");
    } else if (rc && strstr(opjit_errmsg(rt), "(cuBLAS: ") &&
               strstr(opjit_errmsg(rt), "not found")) {
        fprintf(stderr, "note: no cuBLAS here: the direct-call check is skipped\n");
    } else {
        CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        CHECK(dlsym(RTLD_DEFAULT, "cublasCreate_v2") != NULL);
    }
    opjit_destroy(rt);
    tmpdirs_remove();
    return t_failed_checks ? 1 : 0;
}

static void cublas_callers_load(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    char cache[1100];
    snprintf(cache, sizeof cache, "QCU_CACHE=%s/cache", d);
    const char *fail[] = {cache, "QCU_EXPECT=error",
                          "OPJIT_CUBLAS_LIBRARY=/nonexistent/libcublas.so.13", NULL};
    int st = run_child("--child-cublas-direct", fail);
    CHECKF(st == 0, "a cuBLAS caller without cuBLAS: the child exited %d", st);
    const char *load[] = {cache, "QCU_EXPECT=load", "OPJIT_CUBLAS_LIBRARY", NULL};
    st = run_child("--child-cublas-direct", load);
    CHECKF(st == 0, "a cuBLAS caller: the child exited %d", st);
}

/* ---- a fake driver: the runtime's CUDA path and the host halves ---------------------- */

/* What tests/fake_libcuda.c keeps; the same layout. */
typedef struct fake_stats {
    int primary_refs, ctx_depth, ctx_depth_max;
    long live_allocs;
    int modules_loaded, modules_unloaded, launches, last_image_ptx;
    char last_image_arch[32];
    void *last_pushed;
    int errors;
    char first_error[256];
} fake_stats;

static struct {
    void *dl;
    fake_stats *(*stats)(void);
    int (*retain)(void **, int);
    int (*release)(int);
    int (*push)(void *);
    int (*pop)(void **);
    int (*alloc)(unsigned long long *, size_t);
    int (*free_)(unsigned long long);
} fk;

static int fake_open(void)
{
    const char *path = getenv("OPJIT_CUDA_DRIVER");
    fk.dl = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    CHECKF(fk.dl != NULL, "dlopen %s: %s", path ? path : "(unset)", dlerror());
    if (!fk.dl)
        return 0;
    *(void **)&fk.stats = dlsym(fk.dl, "fake_stats_get");
    *(void **)&fk.retain = dlsym(fk.dl, "cuDevicePrimaryCtxRetain");
    *(void **)&fk.release = dlsym(fk.dl, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&fk.push = dlsym(fk.dl, "cuCtxPushCurrent_v2");
    *(void **)&fk.pop = dlsym(fk.dl, "cuCtxPopCurrent_v2");
    *(void **)&fk.alloc = dlsym(fk.dl, "cuMemAlloc_v2");
    *(void **)&fk.free_ = dlsym(fk.dl, "cuMemFree_v2");
    return fk.stats && fk.alloc;
}

/* "Device" memory holding a copy of host data (the fake's device memory
 * is host memory). */
static void *fake_dev(const void *host, size_t n)
{
    void *ctx, *dummy;
    unsigned long long p = 0;
    fk.retain(&ctx, 0);
    fk.push(ctx);
    fk.alloc(&p, n ? n : 1);
    fk.pop(&dummy);
    fk.release(0);
    if (n)
        memcpy((void *)(uintptr_t)p, host, n);
    return (void *)(uintptr_t)p;
}

static void fake_dev_free(void *p)
{
    void *ctx, *dummy;
    fk.retain(&ctx, 0);
    fk.push(ctx);
    fk.free_((unsigned long long)(uintptr_t)p);
    fk.pop(&dummy);
    fk.release(0);
}

static unsigned long long rng = 88172645463325252ull;
static double urand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* nms on both devices: identical index lists. elem: 0 float32, 1 float64,
 * 2 float16, 3 bfloat16. */
static void nms_store(char *p, int64_t i, int elem, double v)
{
    if (elem == 1)
        ((double *)p)[i] = v;
    else if (elem == 0)
        ((float *)p)[i] = (float)v;
    else
        ((uint16_t *)p)[i] = elem == 2 ? opjit_f32_to_f16((float)v) : opjit_f32_to_bf16((float)v);
}

static void nms_same_as_widened(opjit_runtime *rt, opjit_op *op, const DLManagedTensor *got,
                                const char *boxes, const char *scores, int n, int elem,
                                double thr)
{
    float *wb = malloc((size_t)n * 16 + 16), *ws = malloc((size_t)n * 4 + 4);
    for (int i = 0; i < 5 * n; i++) {
        uint16_t h = i < 4 * n ? ((const uint16_t *)boxes)[i] : ((const uint16_t *)scores)[i - 4 * n];
        float f = elem == 2 ? opjit_f16_to_f32(h) : opjit_bf16_to_f32(h);
        if (i < 4 * n)
            wb[i] = f;
        else
            ws[i - 4 * n] = f;
    }
    int64_t bs[2] = {n, 4}, ss[1] = {n};
    DLDataType f32 = {kDLFloat, 32, 1};
    DLTensor tb = tensor(wb, kDLCPU, f32, 2, bs), ts = tensor(ws, kDLCPU, f32, 1, ss);
    opjit_value a[3] = {opjit_tensor(&tb), opjit_tensor(&ts), opjit_float(thr)};
    DLManagedTensor *want = NULL;
    CHECK(opjit_call(rt, op, a, 3, &want, 1) == OPJIT_OK);
    if (want)
        CHECKF(want->dl_tensor.shape[0] == got->dl_tensor.shape[0] &&
                   !memcmp(want->dl_tensor.data, got->dl_tensor.data,
                           (size_t)got->dl_tensor.shape[0] * 8),
               "nms n=%d elem %d thr=%g: not what float32 gives on the widened values", n, elem,
               thr);
    if (want)
        want->deleter(want);
    free(wb);
    free(ws);
}

static void nms_agrees(opjit_runtime *rt, opjit_op *op, int n, int elem, double thr, int mode)
{
    size_t esz = elem == 1 ? 8 : elem == 0 ? 4 : 2;
    char *boxes = malloc((size_t)n * 4 * esz + 8), *scores = malloc((size_t)n * esz + 8);
    for (int i = 0; i < n; i++) {
        double x = urand() * 100, y = urand() * 100, w = urand() * 30, h = urand() * 30;
        double v[4] = {x, y, x + w, y + h}, sc = urand();
        if (mode == 1)
            sc = (double)(int)(urand() * 4); /* many equal scores */
        if (mode == 2 && i % 7 == 0)
            sc = NAN;
        if (mode == 2 && i % 11 == 0)
            v[2] = v[0]; /* empty boxes */
        if (mode == 3 && i % 2)
            memcpy(v, (double[4]){10, 10, 40, 40}, sizeof v); /* duplicates */
        for (int k = 0; k < 4; k++)
            nms_store(boxes, 4 * i + k, elem, v[k]);
        nms_store(scores, i, elem, sc);
    }
    int64_t bs[2] = {n, 4}, ss[1] = {n};
    DLDataType dt = {elem == 3 ? kDLBfloat : kDLFloat, (uint8_t)(esz * 8), 1};
    DLTensor hb = tensor(boxes, kDLCPU, dt, 2, bs), hs = tensor(scores, kDLCPU, dt, 1, ss);
    void *db = fake_dev(boxes, (size_t)n * 4 * esz), *dsc = fake_dev(scores, (size_t)n * esz);
    DLTensor gb = tensor(db, kDLCUDA, dt, 2, bs), gs = tensor(dsc, kDLCUDA, dt, 1, ss);
    opjit_value ha[3] = {opjit_tensor(&hb), opjit_tensor(&hs), opjit_float(thr)};
    opjit_value ga[3] = {opjit_tensor(&gb), opjit_tensor(&gs), opjit_float(thr)};
    DLManagedTensor *ho = NULL, *go = NULL;
    int rc = opjit_call(rt, op, ha, 3, &ho, 1);
    CHECKF(rc == OPJIT_OK, "cpu nms: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, ga, 3, &go, 1);
    CHECKF(rc == OPJIT_OK, "cuda nms n=%d elem %d thr=%g: %s", n, elem, thr, opjit_errmsg(rt));
    if (ho && elem >= 2) /* 16-bit: what float32 gives on the same values, widened */
        nms_same_as_widened(rt, op, ho, boxes, scores, n, elem, thr);
    if (ho && go) {
        CHECK(go->dl_tensor.device.device_type == kDLCUDA);
        CHECK(go->dl_tensor.dtype.code == kDLInt && go->dl_tensor.dtype.bits == 64);
        int64_t nh = ho->dl_tensor.shape[0], ng = go->dl_tensor.shape[0];
        CHECKF(nh == ng && !memcmp(ho->dl_tensor.data, go->dl_tensor.data, (size_t)nh * 8),
               "nms n=%d elem %d thr=%g mode %d: cpu keeps %lld, cuda %lld", n, elem, thr,
               mode, (long long)nh, (long long)ng);
    }
    if (ho)
        ho->deleter(ho);
    if (go)
        go->deleter(go);
    fake_dev_free(db);
    fake_dev_free(dsc);
    free(boxes);
    free(scores);
}

static void mm_agrees(opjit_runtime *rt, opjit_op *op, int n, int k, int m, int is64, int trans)
{
    size_t esz = is64 ? 8 : 4;
    char *a = malloc((size_t)n * k * esz + 8), *b = malloc((size_t)k * m * esz + 8);
    for (int i = 0; i < n * k; i++)
        is64 ? (((double *)a)[i] = urand() - 0.5) : (((float *)a)[i] = (float)(urand() - 0.5));
    for (int i = 0; i < k * m; i++)
        is64 ? (((double *)b)[i] = urand() - 0.5) : (((float *)b)[i] = (float)(urand() - 0.5));
    DLDataType dt = {kDLFloat, (uint8_t)(esz * 8), 1};
    /* trans: a holds self transposed ([k, n] memory read as [n, k]). */
    int64_t as[2] = {n, k}, bs[2] = {k, m}, ast[2] = {1, n};
    DLTensor ha = tensor(a, kDLCPU, dt, 2, as), hb = tensor(b, kDLCPU, dt, 2, bs);
    if (trans)
        ha.strides = ast;
    void *da = fake_dev(a, (size_t)n * k * esz), *dbp = fake_dev(b, (size_t)k * m * esz);
    DLTensor ga = tensor(da, kDLCUDA, dt, 2, as), gb = tensor(dbp, kDLCUDA, dt, 2, bs);
    if (trans)
        ga.strides = ast;
    opjit_value hv[2] = {opjit_tensor(&ha), opjit_tensor(&hb)};
    opjit_value gv[2] = {opjit_tensor(&ga), opjit_tensor(&gb)};
    DLManagedTensor *ho = NULL, *go = NULL;
    int rc = opjit_call(rt, op, hv, 2, &ho, 1);
    CHECKF(rc == OPJIT_OK, "cpu mm: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, gv, 2, &go, 1);
    CHECKF(rc == OPJIT_OK, "cuda mm %dx%dx%d: %s", n, k, m, opjit_errmsg(rt));
    if (ho && go) {
        CHECK(go->dl_tensor.shape[0] == n && go->dl_tensor.shape[1] == m);
        double worst = 0;
        for (int i = 0; i < n * m; i++) {
            double x = is64 ? ((double *)ho->dl_tensor.data)[i] : ((float *)ho->dl_tensor.data)[i];
            double y = is64 ? ((double *)go->dl_tensor.data)[i] : ((float *)go->dl_tensor.data)[i];
            double e = fabs(x - y) / (1 + fabs(x));
            if (e > worst)
                worst = e;
        }
        CHECKF(worst < (is64 ? 1e-12 : 1e-5), "mm %dx%dx%d: relative error %g", n, k, m, worst);
    }
    if (ho)
        ho->deleter(ho);
    if (go)
        go->deleter(go);
    fake_dev_free(da);
    fake_dev_free(dbp);
    free(a);
    free(b);
}


/* Relative worst difference of n elements of two outputs. */
static double worst_rel(const DLManagedTensor *a, const DLManagedTensor *b, int64_t n, int is64)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = is64 ? ((double *)a->dl_tensor.data)[i] : ((float *)a->dl_tensor.data)[i];
        double y = is64 ? ((double *)b->dl_tensor.data)[i] : ((float *)b->dl_tensor.data)[i];
        double e = fabs(x - y) / (1 + fabs(x));
        if (!(e <= worst))
            worst = e;
    }
    return worst;
}

/* mm_backward on the fake device (this file's kernel serves: cuBLAS does
 * not run on a stand-in driver) against the CPU twin; self transposed in
 * memory when trans; both gradients. */
static void mm_bw_agrees(opjit_runtime *rt, opjit_op *op, int n, int k, int m, int is64,
                         int trans)
{
    size_t esz = is64 ? 8 : 4;
    int64_t gs[2] = {n, m}, as[2] = {n, k}, bs[2] = {k, m}, ast[2] = {1, n};
    int64_t cnt[3] = {(int64_t)n * m, (int64_t)n * k, (int64_t)k * m};
    char *h[3];
    void *d[3];
    DLTensor ht[3], gt[3];
    DLDataType dt = {kDLFloat, (uint8_t)(esz * 8), 1};
    const int64_t *shape[3] = {gs, as, bs};
    for (int t = 0; t < 3; t++) {
        h[t] = malloc((size_t)cnt[t] * esz + 8);
        for (int64_t i = 0; i < cnt[t]; i++)
            is64 ? (((double *)h[t])[i] = urand() - 0.5) : (((float *)h[t])[i] = (float)(urand() - 0.5));
        d[t] = fake_dev(h[t], (size_t)cnt[t] * esz);
        ht[t] = tensor(h[t], kDLCPU, dt, 2, (int64_t *)shape[t]);
        gt[t] = tensor(d[t], kDLCUDA, dt, 2, (int64_t *)shape[t]);
    }
    if (trans)
        ht[1].strides = gt[1].strides = ast;
    opjit_value hv[3] = {opjit_tensor(&ht[0]), opjit_tensor(&ht[1]), opjit_tensor(&ht[2])};
    opjit_value gv[3] = {opjit_tensor(&gt[0]), opjit_tensor(&gt[1]), opjit_tensor(&gt[2])};
    DLManagedTensor *ho[2] = {NULL, NULL}, *go[2] = {NULL, NULL};
    int rc = opjit_call(rt, op, hv, 3, ho, 2);
    CHECKF(rc == OPJIT_OK, "cpu mm_backward: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, gv, 3, go, 2);
    CHECKF(rc == OPJIT_OK, "cuda mm_backward %dx%dx%d: %s", n, k, m, opjit_errmsg(rt));
    for (int i = 0; i < 2 && ho[i] && go[i]; i++) {
        double w = worst_rel(ho[i], go[i], cnt[i + 1], is64);
        CHECKF(w < (is64 ? 1e-12 : 1e-5), "mm_backward %dx%dx%d output %d: relative error %g", n,
               k, m, i, w);
    }
    for (int i = 0; i < 2; i++) {
        if (ho[i])
            ho[i]->deleter(ho[i]);
        if (go[i])
            go[i]->deleter(go[i]);
    }
    for (int t = 0; t < 3; t++) {
        fake_dev_free(d[t]);
        free(h[t]);
    }
}

/* conv2d_backward on the fake device, where no cuDNN runs: grad_bias alone
 * (a channels_last grad, gathered first), then an empty batch (grad_weight
 * zeros) and no input channels, each against the CPU twin. */
static void conv_bw_fake(opjit_runtime *rt, opjit_op *op)
{
    DLDataType dt = {kDLFloat, 32, 1};
    int64_t ys[4] = {2, 3, 4, 5}, yst[4] = {60, 1, 15, 3}, xs[4] = {2, 2, 6, 7};
    int64_t ws[4] = {3, 2, 3, 3}, bs[1] = {3}, mask[3] = {0, 0, 1}, all[3] = {1, 1, 1};
    float hy[120], hx[168], hw[54], hb[3] = {0, 0, 0};
    for (int i = 0; i < 120; i++)
        hy[i] = (float)(urand() - 0.5);
    for (int i = 0; i < 168; i++)
        hx[i] = (float)(urand() - 0.5);
    for (int i = 0; i < 54; i++)
        hw[i] = (float)(urand() - 0.5);
    void *dy = fake_dev(hy, sizeof hy), *dx = fake_dev(hx, sizeof hx);
    void *dw = fake_dev(hw, sizeof hw), *dbias = fake_dev(hb, sizeof hb);
    DLTensor gy = tensor(dy, kDLCUDA, dt, 4, ys), gx = tensor(dx, kDLCUDA, dt, 4, xs);
    DLTensor gw = tensor(dw, kDLCUDA, dt, 4, ws), gb = tensor(dbias, kDLCUDA, dt, 1, bs);
    DLTensor cy = tensor(hy, kDLCPU, dt, 4, ys), cx = tensor(hx, kDLCPU, dt, 4, xs);
    DLTensor cw = tensor(hw, kDLCPU, dt, 4, ws), cb = tensor(hb, kDLCPU, dt, 1, bs);
    gy.strides = cy.strides = yst;
    opjit_value gv[9] = {opjit_tensor(&gy), opjit_tensor(&gx), opjit_tensor(&gw),
                         opjit_tensor(&gb), opjit_int(1), opjit_int(0), opjit_int(1),
                         opjit_int(1), opjit_ints(mask, 3)};
    opjit_value cv[9];
    memcpy(cv, gv, sizeof gv);
    cv[0] = opjit_tensor(&cy), cv[1] = opjit_tensor(&cx), cv[2] = opjit_tensor(&cw);
    cv[3] = opjit_tensor(&cb);
    DLManagedTensor *ho[3] = {0}, *go[3] = {0};
    int rc = opjit_call(rt, op, cv, 9, ho, 3);
    CHECKF(rc == OPJIT_OK, "cpu conv2d_backward: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, gv, 9, go, 3);
    CHECKF(rc == OPJIT_OK, "cuda conv2d_backward grad_bias: %s", opjit_errmsg(rt));
    if (ho[2] && go[2]) {
        CHECK(go[0]->dl_tensor.ndim == 1 && go[0]->dl_tensor.shape[0] == 0);
        CHECKF(worst_rel(ho[2], go[2], 3, 0) < 1e-6, "grad_bias: %g", worst_rel(ho[2], go[2], 3, 0));
    }
    for (int i = 0; i < 3; i++) {
        if (ho[i])
            ho[i]->deleter(ho[i]);
        if (go[i])
            go[i]->deleter(go[i]);
        ho[i] = go[i] = NULL;
    }
    /* An empty batch: grad_weight is zeros, grad_bias too, without cuDNN. */
    int64_t y0[4] = {0, 3, 4, 5}, x0[4] = {0, 2, 6, 7};
    DLTensor ey = tensor(dy, kDLCUDA, dt, 4, y0), ex = tensor(dx, kDLCUDA, dt, 4, x0);
    gv[0] = opjit_tensor(&ey), gv[1] = opjit_tensor(&ex), gv[8] = opjit_ints(all, 3);
    rc = opjit_call(rt, op, gv, 9, go, 3);
    CHECKF(rc == OPJIT_OK, "cuda conv2d_backward N=0: %s", opjit_errmsg(rt));
    if (go[1] && go[2]) {
        int zeros = 1;
        for (int i = 0; i < 54; i++)
            zeros &= ((float *)go[1]->dl_tensor.data)[i] == 0;
        CHECKF(zeros, "N=0: grad_weight must be zeros");
        CHECK(((float *)go[2]->dl_tensor.data)[0] == 0 && go[0]->dl_tensor.shape[0] == 0);
    }
    for (int i = 0; i < 3; i++)
        if (go[i])
            go[i]->deleter(go[i]);
    fake_dev_free(dy), fake_dev_free(dx), fake_dev_free(dw), fake_dev_free(dbias);
}

/* ---- float16 and bfloat16 on the fake device ------------------------------------------- */

/* op on the fake device with 16-bit tensors (hv) against the same op with
 * float32 tensors of the widened values (fv): every output must be the
 * float32 one rounded once (the device widens, runs the float32 path,
 * rounds), bit for bit. */
static void half_is_rounded_f32(opjit_runtime *rt, opjit_op *op, int bf, const char *what,
                                opjit_value *hv, opjit_value *fv, int nargs, int nouts)
{
    DLManagedTensor *ho[3] = {0}, *fo[3] = {0};
    int rh = opjit_call(rt, op, hv, nargs, ho, nouts);
    CHECKF(rh == OPJIT_OK, "%s (%s): %s", what, bf ? "bf16" : "f16", opjit_errmsg(rt));
    int rf = opjit_call(rt, op, fv, nargs, fo, nouts);
    CHECKF(rf == OPJIT_OK, "%s float32: %s", what, opjit_errmsg(rt));
    for (int o = 0; o < nouts && rh == OPJIT_OK && rf == OPJIT_OK; o++) {
        DLTensor *a = &ho[o]->dl_tensor, *b = &fo[o]->dl_tensor;
        int64_t n = 1, bad = 0;
        for (int i = 0; i < b->ndim; i++)
            n *= b->shape[i];
        CHECKF(a->dtype.bits == 16 && a->dtype.code == (bf ? kDLBfloat : kDLFloat) &&
                   a->device.device_type == kDLCUDA && a->ndim == b->ndim,
               "%s: output %d", what, o);
        for (int64_t i = 0; i < n; i++) {
            float f = ((float *)b->data)[i];
            bad += ((uint16_t *)a->data)[i] != (bf ? opjit_f32_to_bf16(f) : opjit_f32_to_f16(f));
        }
        CHECKF(bad == 0, "%s (%s) output %d: %lld of %lld are not round(float32)", what,
               bf ? "bf16" : "f16", o, (long long)bad, (long long)n);
    }
    for (int o = 0; o < 3; o++) {
        if (ho[o])
            ho[o]->deleter(ho[o]);
        if (fo[o])
            fo[o]->deleter(fo[o]);
    }
}

/* A 16-bit tensor and its float32 widening, both on the fake device. */
typedef struct half_pair {
    int64_t shape[4], n;
    void *d16, *d32;
    DLTensor t16, t32;
} half_pair;

static void half_pair_init(half_pair *p, int bf, int ndim, const int64_t *shape)
{
    p->n = 1;
    for (int i = 0; i < ndim; i++)
        p->n *= p->shape[i] = shape[i];
    uint16_t *h = malloc((size_t)p->n * 2 + 2);
    float *f = malloc((size_t)p->n * 4 + 4);
    for (int64_t i = 0; i < p->n; i++) {
        float v = (float)(4 * urand() - 2);
        h[i] = bf ? opjit_f32_to_bf16(v) : opjit_f32_to_f16(v);
        f[i] = bf ? opjit_bf16_to_f32(h[i]) : opjit_f16_to_f32(h[i]);
    }
    p->d16 = fake_dev(h, (size_t)p->n * 2);
    p->d32 = fake_dev(f, (size_t)p->n * 4);
    DLDataType d16 = {bf ? kDLBfloat : kDLFloat, 16, 1}, d32 = {kDLFloat, 32, 1};
    p->t16 = tensor(p->d16, kDLCUDA, d16, ndim, p->shape);
    p->t32 = tensor(p->d32, kDLCUDA, d32, ndim, p->shape);
    free(h);
    free(f);
}

static void half_pair_free(half_pair *p)
{
    fake_dev_free(p->d16);
    fake_dev_free(p->d32);
}

/* mm and mm_backward (this file's kernel: no cuBLAS on a stand-in), dense
 * and with a transposed self. */
static void mm_half_fake(opjit_runtime *rt, opjit_op *mm, opjit_op *mm_bw, int bf)
{
    static const int dims[][3] = {{1, 1, 1}, {65, 17, 130}, {3, 0, 4}, {0, 2, 3}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        for (int tr = 0; tr < 2; tr++) {
            int64_t n = dims[i][0], k = dims[i][1], m = dims[i][2];
            int64_t as[2] = {n, k}, bs[2] = {k, m}, gs[2] = {n, m}, ast[2] = {1, n};
            half_pair a, b, g;
            half_pair_init(&a, bf, 2, as);
            half_pair_init(&b, bf, 2, bs);
            half_pair_init(&g, bf, 2, gs);
            if (tr) /* self's memory read as its transpose */
                a.t16.strides = a.t32.strides = ast;
            opjit_value hv[3] = {opjit_tensor(&a.t16), opjit_tensor(&b.t16)};
            opjit_value fv[3] = {opjit_tensor(&a.t32), opjit_tensor(&b.t32)};
            half_is_rounded_f32(rt, mm, bf, "cuda mm", hv, fv, 2, 1);
            opjit_value hb[3] = {opjit_tensor(&g.t16), opjit_tensor(&a.t16), opjit_tensor(&b.t16)};
            opjit_value fb[3] = {opjit_tensor(&g.t32), opjit_tensor(&a.t32), opjit_tensor(&b.t32)};
            half_is_rounded_f32(rt, mm_bw, bf, "cuda mm_backward", hb, fb, 3, 2);
            if (i == 1) { /* the widened path by name; cuBLAS demanded, and absent */
                setenv("OPJIT_MM_KERNEL", "wide", 1);
                half_is_rounded_f32(rt, mm, bf, "cuda mm, wide", hv, fv, 2, 1);
                half_is_rounded_f32(rt, mm_bw, bf, "cuda mm_backward, wide", hb, fb, 3, 2);
                setenv("OPJIT_MM_KERNEL", "cublas", 1);
                DLManagedTensor *o1[1] = {0};
                CHECK(opjit_call(rt, mm, hv, 2, o1, 1) != OPJIT_OK);
                CHECK_STR_CONTAINS(opjit_errmsg(rt), "OPJIT_MM_KERNEL=cublas, but cuBLAS cannot");
                unsetenv("OPJIT_MM_KERNEL");
            }
            half_pair_free(&a);
            half_pair_free(&b);
            half_pair_free(&g);
        }
}

/* conv2d where no cuDNN runs on the fake: the forward without input
 * channels (the bias), and grad_bias alone of a channels_last grad. */
static void conv_half_fake(opjit_runtime *rt, opjit_op *conv, opjit_op *conv_bw, int bf)
{
    int64_t xs[4] = {2, 0, 5, 5}, ws[4] = {3, 0, 3, 3}, bsz[1] = {3};
    half_pair x, w, b;
    half_pair_init(&x, bf, 4, xs);
    half_pair_init(&w, bf, 4, ws);
    half_pair_init(&b, bf, 1, bsz);
    opjit_value hv[3] = {opjit_tensor(&x.t16), opjit_tensor(&w.t16), opjit_tensor(&b.t16)};
    opjit_value fv[3] = {opjit_tensor(&x.t32), opjit_tensor(&w.t32), opjit_tensor(&b.t32)};
    half_is_rounded_f32(rt, conv, bf, "cuda conv2d, no input channels", hv, fv, 3, 1);
    half_pair_free(&x);
    half_pair_free(&w);
    half_pair_free(&b);
    int64_t ys[4] = {2, 3, 4, 5}, yst[4] = {60, 1, 15, 3}, xs2[4] = {2, 2, 6, 7};
    int64_t ws2[4] = {3, 2, 3, 3}, mask[3] = {0, 0, 1};
    half_pair y, x2, w2, b2;
    half_pair_init(&y, bf, 4, ys);
    half_pair_init(&x2, bf, 4, xs2);
    half_pair_init(&w2, bf, 4, ws2);
    half_pair_init(&b2, bf, 1, bsz);
    y.t16.strides = y.t32.strides = yst; /* channels_last: widened through its strides */
    opjit_value hb[9] = {opjit_tensor(&y.t16), opjit_tensor(&x2.t16), opjit_tensor(&w2.t16),
                         opjit_tensor(&b2.t16), opjit_int(1), opjit_int(0), opjit_int(1),
                         opjit_int(1), opjit_ints(mask, 3)};
    opjit_value fb[9];
    memcpy(fb, hb, sizeof hb);
    fb[0] = opjit_tensor(&y.t32), fb[1] = opjit_tensor(&x2.t32), fb[2] = opjit_tensor(&w2.t32);
    fb[3] = opjit_tensor(&b2.t32);
    half_is_rounded_f32(rt, conv_bw, bf, "cuda conv2d_backward grad_bias", hb, fb, 9, 3);
    /* the tensor-core path's knob: a bad value is an error; "tensor" demands
     * that path and says why a call cannot take it (here: a channels_last
     * grad would need a gather); "wide" keeps the widened path */
    DLManagedTensor *o3[3] = {0};
    setenv("OPJIT_CUDNN_HALF", "fast", 1);
    CHECK(opjit_call(rt, conv_bw, hb, 9, o3, 3) != OPJIT_OK);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "OPJIT_CUDNN_HALF is 'fast': expected auto, tensor");
    int64_t mask2[3] = {1, 1, 1};
    hb[8] = opjit_ints(mask2, 3);
    setenv("OPJIT_CUDNN_HALF", "tensor", 1);
    CHECK(opjit_call(rt, conv_bw, hb, 9, o3, 3) != OPJIT_OK);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "OPJIT_CUDNN_HALF=tensor, but this call cannot take "
                                         "cuDNN's 16-bit path: an operand that is not dense");
    hb[8] = opjit_ints(mask, 3);
    setenv("OPJIT_CUDNN_HALF", "wide", 1);
    half_is_rounded_f32(rt, conv_bw, bf, "cuda conv2d_backward grad_bias, wide", hb, fb, 9, 3);
    unsetenv("OPJIT_CUDNN_HALF");
    half_pair_free(&y);
    half_pair_free(&x2);
    half_pair_free(&w2);
    half_pair_free(&b2);
}

/* ---- opjit_tensor_to_device ------------------------------------------------------------ */

/* One tensor shape and dtype to round-trip, with its layout quirks. */
typedef struct rt_case {
    const char *what;
    DLDataType dt;
    int ndim;
    int64_t shape[4];
    int64_t strides[4]; /* used when strided */
    int strided;
    uint64_t byte_offset;
} rt_case;

static const rt_case round_trip_cases[] = {
    {"f32 [2,3]", {kDLFloat, 32, 1}, 2, {2, 3}, {0}, 0, 0},
    {"f64 [5]", {kDLFloat, 64, 1}, 1, {5}, {0}, 0, 0},
    {"f16 [3,1,4]", {kDLFloat, 16, 1}, 3, {3, 1, 4}, {0}, 0, 0},
    {"i8 [17]", {kDLInt, 8, 1}, 1, {17}, {0}, 0, 0},
    {"u8 [4,4]", {kDLUInt, 8, 1}, 2, {4, 4}, {0}, 0, 0},
    {"i16 [2,2,2,2]", {kDLInt, 16, 1}, 4, {2, 2, 2, 2}, {0}, 0, 0},
    {"i32 [9]", {kDLInt, 32, 1}, 1, {9}, {0}, 0, 0},
    {"i64 [3,2]", {kDLInt, 64, 1}, 2, {3, 2}, {0}, 0, 0},
    {"bool [6]", {OPJIT_DL_BOOL, 8, 1}, 1, {6}, {0}, 0, 0},
    {"f32x4 lanes [3]", {kDLFloat, 32, 4}, 1, {3}, {0}, 0, 0},
    {"0-d f64", {kDLFloat, 64, 1}, 0, {0}, {0}, 0, 0},
    {"empty [0]", {kDLFloat, 32, 1}, 1, {0}, {0}, 0, 0},
    {"empty [3,0,2]", {kDLInt, 64, 1}, 3, {3, 0, 2}, {0}, 0, 0},
    {"empty, odd strides", {kDLFloat, 32, 1}, 2, {0, 4}, {1, 7}, 1, 0},
    {"row-major strides", {kDLFloat, 32, 1}, 2, {2, 3}, {3, 1}, 1, 0},
    {"size-1 dim, any stride", {kDLInt, 32, 1}, 3, {1, 2, 3}, {99, 3, 1}, 1, 0},
    {"byte_offset", {kDLFloat, 64, 1}, 1, {4}, {0}, 0, 24},
};

static size_t case_bytes(const rt_case *c)
{
    size_t n = (size_t)c->dt.bits / 8 * c->dt.lanes;
    for (int i = 0; i < c->ndim; i++)
        n *= (size_t)c->shape[i];
    return n;
}

/* A CPU tensor of random bytes (at data + byte_offset) to device:id and
 * back: the bytes, dtype and shape survive; each copy is contiguous, on the
 * device asked for, with shape memory of its own. */
static void round_trip(opjit_runtime *rt, const rt_case *c, int device, int id)
{
    size_t bytes = case_bytes(c);
    unsigned char *host = malloc(bytes + c->byte_offset + 1);
    for (size_t i = 0; i < bytes + c->byte_offset; i++)
        host[i] = (unsigned char)(urand() * 256);
    int64_t shape[4], strides[4];
    memcpy(shape, c->shape, sizeof shape);
    memcpy(strides, c->strides, sizeof strides);
    DLTensor src = tensor(host, kDLCPU, c->dt, c->ndim, c->ndim ? shape : NULL);
    if (c->strided)
        src.strides = strides;
    src.byte_offset = c->byte_offset;
    DLManagedTensor *mid = NULL, *back = NULL;
    int rc = opjit_tensor_to_device(rt, &src, device, id, &mid);
    CHECKF(rc == OPJIT_OK && mid, "%s to %s:%d: %s", c->what, opjit_device_name(device), id,
           opjit_errmsg(rt));
    if (mid) {
        const DLTensor *m = &mid->dl_tensor;
        CHECKF(m->device.device_type == (device == OPJIT_CUDA ? kDLCUDA : kDLCPU) &&
               m->device.device_id == id, "%s: on %d:%d", c->what, m->device.device_type,
               m->device.device_id);
        CHECK(m->ndim == c->ndim && m->strides == NULL && m->byte_offset == 0);
        CHECK(m->dtype.code == c->dt.code && m->dtype.bits == c->dt.bits &&
              m->dtype.lanes == c->dt.lanes);
        CHECK(c->ndim == 0 || (m->shape != shape && !memcmp(m->shape, c->shape,
                                                            (size_t)c->ndim * 8)));
        CHECK(m->data != NULL);
        /* The fake's device memory is host memory: the bytes are there. */
        CHECKF(!bytes || !memcmp(m->data, host + c->byte_offset, bytes), "%s: bytes differ on %s",
               c->what, opjit_device_name(device));
        rc = opjit_tensor_to_device(rt, m, OPJIT_CPU, 0, &back);
        CHECKF(rc == OPJIT_OK && back, "%s back: %s", c->what, opjit_errmsg(rt));
    }
    if (back) {
        const DLTensor *b = &back->dl_tensor;
        CHECK(b->device.device_type == kDLCPU && b->device.device_id == 0 && !b->strides);
        CHECK(b->ndim == c->ndim && (c->ndim == 0 || !memcmp(b->shape, c->shape,
                                                             (size_t)c->ndim * 8)));
        CHECK(((uintptr_t)b->data & 63) == 0);
        CHECKF(!bytes || !memcmp(b->data, host + c->byte_offset, bytes), "%s: round trip "
               "through %s changed the bytes", c->what, opjit_device_name(device));
        back->deleter(back);
    }
    if (mid)
        mid->deleter(mid);
    free(host);
}

/* Fake driver with two devices (FAKE_CUDA_DEVICES=2). */
static void to_device_round_trips(fake_stats *st, const char *cache)
{
    opjit_runtime *rt = rt_new(cache, "sm_90");
    long allocs = st->live_allocs;
    size_t ncases = sizeof round_trip_cases / sizeof *round_trip_cases;
    for (size_t i = 0; i < ncases; i++) {
        round_trip(rt, &round_trip_cases[i], OPJIT_CUDA, 0);
        round_trip(rt, &round_trip_cases[i], OPJIT_CUDA, 1);
        round_trip(rt, &round_trip_cases[i], OPJIT_CPU, 0);
    }
    CHECKF(st->live_allocs == allocs, "live device allocations %ld -> %ld", allocs,
           st->live_allocs);
    CHECK(st->ctx_depth == 0);

    /* CUDA to CUDA: on one device (device to device), across two (through
     * the host); the bytes survive. */
    double v[6] = {1.5, -2, 3.25, 1e300, -0.0, 42};
    int64_t sh[2] = {2, 3};
    DLDataType f64 = {kDLFloat, 64, 1};
    DLTensor h = tensor(v, kDLCPU, f64, 2, sh);
    DLManagedTensor *g0 = NULL, *g0b = NULL, *g1 = NULL, *back = NULL;
    CHECK(opjit_tensor_to_device(rt, &h, OPJIT_CUDA, 0, &g0) == OPJIT_OK && g0);
    if (g0) {
        CHECK(opjit_tensor_to_device(rt, &g0->dl_tensor, OPJIT_CUDA, 0, &g0b) == OPJIT_OK && g0b);
        if (g0b) {
            CHECK(g0b->dl_tensor.data != g0->dl_tensor.data);
            CHECK(opjit_tensor_to_device(rt, &g0b->dl_tensor, OPJIT_CUDA, 1, &g1) == OPJIT_OK);
        }
        if (g1) {
            CHECK(g1->dl_tensor.device.device_id == 1);
            CHECK(opjit_tensor_to_device(rt, &g1->dl_tensor, OPJIT_CPU, 0, &back) == OPJIT_OK);
        }
        if (back)
            CHECK(!memcmp(back->dl_tensor.data, v, sizeof v));
    }
    /* A view into device memory: read from data + byte_offset, to the
     * host and to the other device. */
    DLManagedTensor *vh = NULL, *v1 = NULL, *v1h = NULL;
    if (g0) {
        int64_t five[1] = {5};
        DLTensor view = tensor(g0->dl_tensor.data, kDLCUDA, f64, 1, five);
        view.byte_offset = 8;
        CHECK(opjit_tensor_to_device(rt, &view, OPJIT_CPU, 0, &vh) == OPJIT_OK && vh);
        if (vh)
            CHECK(vh->dl_tensor.shape[0] == 5 && !memcmp(vh->dl_tensor.data, v + 1, 5 * 8));
        CHECK(opjit_tensor_to_device(rt, &view, OPJIT_CUDA, 1, &v1) == OPJIT_OK && v1);
        if (v1)
            CHECK(opjit_tensor_to_device(rt, &v1->dl_tensor, OPJIT_CPU, 0, &v1h) == OPJIT_OK);
        if (v1h)
            CHECK(!memcmp(v1h->dl_tensor.data, v + 1, 5 * 8));
    }
    DLManagedTensor *all[7] = {g0, g0b, g1, back, vh, v1, v1h};
    for (int i = 0; i < 7; i++)
        if (all[i])
            all[i]->deleter(all[i]);

    /* Refused before anything is allocated or made current. */
    long before = st->live_allocs;
    float m[6] = {0};
    int64_t mt_strides[2] = {1, 2}; /* a transposed [2, 3] */
    DLTensor strided = tensor(m, kDLCPU, (DLDataType){kDLFloat, 32, 1}, 2, sh);
    strided.strides = mt_strides;
    DLManagedTensor *out = (DLManagedTensor *)&strided;
    int rc = opjit_tensor_to_device(rt, &strided, OPJIT_CUDA, 0, &out);
    CHECK(rc == OPJIT_EINVAL && out == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "not contiguous");
    rc = opjit_tensor_to_device(rt, &strided, OPJIT_CPU, 0, &out);
    CHECK(rc == OPJIT_EINVAL && out == NULL);
    CHECK(st->live_allocs == before && st->ctx_depth == 0);
    /* A device that does not exist. */
    rc = opjit_tensor_to_device(rt, &h, OPJIT_CUDA, 2, &out);
    CHECK(rc == OPJIT_EDEVICE && out == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "there is no CUDA device 2 (2 found)");
    DLTensor on5 = tensor(v, kDLCUDA, f64, 2, sh);
    on5.device.device_id = 5;
    rc = opjit_tensor_to_device(rt, &on5, OPJIT_CPU, 0, &out);
    CHECK(rc == OPJIT_EDEVICE && out == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "cannot copy from CUDA device 5");
    CHECK(st->live_allocs == before && st->ctx_depth == 0);

    /* A copy outlives the runtime, holding the primary context. */
    out = NULL;
    rc = opjit_tensor_to_device(rt, &h, OPJIT_CUDA, 0, &out);
    CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
    opjit_destroy(rt);
    CHECK(st->primary_refs >= 1);
    if (out) {
        CHECK(!memcmp(out->dl_tensor.data, v, sizeof v));
        out->deleter(out);
    }
    CHECKF(st->primary_refs == 0 && st->live_allocs == allocs, "refs %d, allocs %ld",
           st->primary_refs, st->live_allocs);

    /* The host's context and stream: used, never retained. */
    static char host_ctx;
    rt = rt_new(cache, "sm_90");
    CHECK(opjit_set_cuda_stream(rt, 0, &host_ctx, (void *)(uintptr_t)0x5151) == OPJIT_OK);
    out = NULL;
    rc = opjit_tensor_to_device(rt, &h, OPJIT_CUDA, 0, &out);
    CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
    CHECK(st->last_pushed == &host_ctx && st->primary_refs == 0);
    if (out)
        out->deleter(out);
    opjit_destroy(rt);
    CHECK(st->primary_refs == 0 && st->live_allocs == allocs && st->ctx_depth == 0);
}

/* mm on the fake device: a [2, 3] (a0, a1: its strides) times [3, 2];
 * OPJIT_OK or the failure, the launches it made in *launches. */
static int fake_mm(opjit_runtime *rt, opjit_op *mm, fake_stats *st, int64_t a0, int64_t a1,
                   int *launches)
{
    static const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 2, 1, 0, 3};
    int64_t as[2] = {2, 3}, bs[2] = {3, 2}, ast[2] = {a0, a1};
    DLDataType dt = {kDLFloat, 32, 1};
    void *da = fake_dev(a, sizeof a), *db = fake_dev(b, sizeof b);
    DLTensor ta = tensor(da, kDLCUDA, dt, 2, as), tb = tensor(db, kDLCUDA, dt, 2, bs);
    ta.strides = ast;
    opjit_value v[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
    DLManagedTensor *out = NULL;
    int before = st->launches;
    int rc = opjit_call(rt, mm, v, 2, &out, 1);
    *launches = st->launches - before;
    if (rc == OPJIT_OK) {
        /* Row i of self is a[i*a0 + j*a1]. */
        float want[4];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                want[2 * i + j] = 0;
                for (int k = 0; k < 3; k++)
                    want[2 * i + j] += a[i * a0 + k * a1] * b[2 * k + j];
            }
        CHECKF(out && !memcmp(out->dl_tensor.data, want, sizeof want),
               "mm with strides %lld, %lld: wrong values", (long long)a0, (long long)a1);
    } else {
        CHECK(out == NULL);
    }
    if (out)
        out->deleter(out);
    fake_dev_free(da);
    fake_dev_free(db);
    return rc;
}

/* Child: the fake driver, a GPU of FAKE_CUDA_CC. QCU_SCENARIO picks what to
 * check. */
static int child_fake_driver(void)
{
    const char *scen = getenv("QCU_SCENARIO"), *cache = getenv("QCU_CACHE");
    if (!fake_open())
        return 1;
    fake_stats *st = fk.stats();
    char why[512];
    char path[2048];
    if (!strcmp(scen, "no-device")) {
        /* A driver without devices: CPU only by name, a clear error for a
         * CUDA call. */
        CHECK(cuda_available(why, sizeof why) == OPJIT_EDEVICE);
        CHECK_STR_CONTAINS(why, "no CUDA device");
        opjit_runtime *rt = rt_new(cache, "sm_90");
        opjit_op *op = NULL;
        int rc = opjit_load_op(rt, "mm", &op);
        CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
        opjit_op_info oi = {.size = sizeof oi};
        if (op && opjit_op_info_get(rt, op, &oi) == OPJIT_OK)
            CHECK(oi.source[OPJIT_CUDA] == NULL);
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        rc = opjit_load_file(rt, path, &op, NULL);
        CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        float a[1] = {1};
        int64_t sh[2] = {1, 1};
        DLTensor t = tensor(a, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, sh);
        opjit_value v[2] = {opjit_tensor(&t), opjit_tensor(&t)};
        DLManagedTensor *out = NULL;
        rc = opjit_call(rt, op, v, 2, &out, 1);
        CHECK(rc == OPJIT_EDEVICE && !out);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "no CUDA device");
        opjit_destroy(rt);
        tmpdirs_remove();
        return t_failed_checks ? 1 : 0;
    }
    if (!strcmp(scen, "to-device-nodev")) {
        /* A driver without devices: the reason the call path gives. */
        opjit_runtime *rt = rt_new(cache, "sm_90");
        float a[2] = {1, 2};
        int64_t sh[1] = {2};
        DLTensor t = tensor(a, kDLCPU, (DLDataType){kDLFloat, 32, 1}, 1, sh);
        DLManagedTensor *out = (DLManagedTensor *)&t;
        int rc = opjit_tensor_to_device(rt, &t, OPJIT_CUDA, 0, &out);
        CHECKF(rc == OPJIT_EDEVICE && !out, "got %s", opjit_status_name(rc));
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "no CUDA device");
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "CUDA device 0");
        /* CPU to CPU needs no driver. */
        rc = opjit_tensor_to_device(rt, &t, OPJIT_CPU, 0, &out);
        CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
        if (out)
            out->deleter(out);
        opjit_destroy(rt);
        CHECK(st->live_allocs == 0 && st->ctx_depth == 0);
        CHECKF(st->errors == 0, "%d protocol violations; the first: %s", st->errors,
               st->first_error);
        tmpdirs_remove();
        return t_failed_checks ? 1 : 0;
    }
    CHECKF(cuda_available(why, sizeof why) == OPJIT_OK, "%s", why);
    if (!strcmp(scen, "to-device")) {
        to_device_round_trips(st, cache);
    } else if (!strcmp(scen, "bad-kernel")) {
        /* A launch of a kernel the device code lacks; a device id that
         * does not exist. */
        const char *d = tmpdir_new();
        const char *src = pjoin(d, "qcu_nokernel.cu");
        write_text(src, "#ifdef __CUDACC_RTC__\n"
                        "extern \"C\" __global__ void there(float *x) { x[0] = 1; }\n"
                        "#else\n"
                        "#include <opjit_op.h>\n"
                        "static int f(opjit_ctx *c, opjit_args *a)\n"
                        "{\n"
                        "    unsigned g[3] = {1, 1, 1}, b[3] = {1, 1, 1};\n"
                        "    void *p = opjit_data(opjit_arg_tensor(a, 0));\n"
                        "    void *params[1] = {&p};\n"
                        "    if (!opjit_output(c, 0, OPJIT_FLOAT32, 0, 0)) return -1;\n"
                        "    return opjit_launch(c, \"not_there\", g, b, 0, params);\n"
                        "}\n"
                        "OPJIT_MODULE(qcu_nokernel, m) { opjit_def(m, \"qcu_nokernel(Tensor x) -> "
                        "Tensor\", OPJIT_CUDA, f, \"\"); }\n"
                        "#endif\n");
        opjit_runtime *rt = rt_new(cache, "sm_90");
        opjit_op *op = NULL;
        int rc = opjit_load_file(rt, src, &op, NULL);
        CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
        float one = 1;
        void *dx = fake_dev(&one, 4);
        int64_t sh[1] = {1};
        DLTensor t = tensor(dx, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 1, sh);
        opjit_value v[1] = {opjit_tensor(&t)};
        DLManagedTensor *out = NULL;
        long allocs = st->live_allocs;
        rc = opjit_call(rt, op, v, 1, &out, 1);
        CHECK(rc == OPJIT_EKERNEL && !out);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "no kernel 'not_there'");
        CHECK(st->live_allocs == allocs); /* the output was freed */
        t.device.device_id = 3;
        rc = opjit_call(rt, op, v, 1, &out, 1);
        CHECK(rc == OPJIT_EDEVICE);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "CUDA device 3");
        CHECK(st->ctx_depth == 0);
        opjit_destroy(rt);
        fake_dev_free(dx);
    } else if (!strcmp(scen, "shared")) {
        /* Dynamic shared memory beside static: a kernel with 16 KiB of
         * __shared__ arrays may take only 32 KiB more without opting in,
         * so 40 KiB must be opted in although it is below 48 KiB. */
        const char *d = tmpdir_new();
        const char *src = pjoin(d, "qcu_shared.cu");
        write_text(src, "#ifdef __CUDACC_RTC__\n"
                        "extern \"C\" __global__ void qcu_shared(float *x)\n"
                        "{\n"
                        "    __shared__ float s[4096];\n"
                        "    extern __shared__ float dyn[];\n"
                        "    s[threadIdx.x] = 1;\n"
                        "    dyn[threadIdx.x] = 2;\n"
                        "    __syncthreads();\n"
                        "    x[0] = s[0] + dyn[0];\n"
                        "}\n"
                        "#else\n"
                        "#include <opjit_op.h>\n"
                        "static int f(opjit_ctx *c, opjit_args *a)\n"
                        "{\n"
                        "    unsigned g[3] = {1, 1, 1}, b[3] = {1, 1, 1};\n"
                        "    unsigned shm = (unsigned)opjit_arg_int(a, 1);\n"
                        "    DLTensor *o = opjit_output(c, 0, OPJIT_FLOAT32, 0, 0);\n"
                        "    void *p, *params[1];\n"
                        "    if (!o) return -1;\n"
                        "    p = opjit_data(o);\n"
                        "    params[0] = &p;\n"
                        "    return opjit_launch(c, \"qcu_shared\", g, b, shm, params);\n"
                        "}\n"
                        "OPJIT_MODULE(qcu_shared, m) { opjit_def(m, \"qcu_shared(Tensor x, int "
                        "shm) -> Tensor\", OPJIT_CUDA, f, \"\"); }\n"
                        "#endif\n");
        opjit_runtime *rt = rt_new(cache, "sm_90");
        opjit_op *op = NULL;
        int rc = opjit_load_file(rt, src, &op, NULL);
        CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
        float one = 1;
        void *dx = fake_dev(&one, 4);
        int64_t sh[1] = {1};
        DLTensor t = tensor(dx, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 1, sh);
        static const long sizes[] = {16 << 10, 40 << 10, 100 << 10, 40 << 10};
        for (size_t i = 0; op && i < sizeof sizes / sizeof *sizes; i++) {
            opjit_value v[2] = {opjit_tensor(&t), opjit_int(sizes[i])};
            DLManagedTensor *out = NULL;
            rc = opjit_call(rt, op, v, 2, &out, 1);
            CHECKF(rc == OPJIT_OK && out, "%ld bytes of dynamic shared memory: %s", sizes[i],
                   opjit_errmsg(rt));
            if (out) {
                CHECK(*(float *)out->dl_tensor.data == (float)sizes[i]);
                out->deleter(out);
            }
        }
        /* Beyond what the device allows: a clean error naming the size. */
        opjit_value v[2] = {opjit_tensor(&t), opjit_int(300 << 10)};
        DLManagedTensor *out = NULL;
        rc = opjit_call(rt, op, v, 2, &out, 1);
        CHECK(rc == OPJIT_EKERNEL && !out);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "307200 bytes of dynamic shared memory");
        CHECK(st->ctx_depth == 0);
        opjit_destroy(rt);
        fake_dev_free(dx);
    } else if (!strcmp(scen, "ops")) {
        /* By name: both sources load where CUDA is. */
        opjit_runtime *rt = rt_new(cache, "sm_90");
        opjit_op *nms = NULL, *mm = NULL, *conv = NULL;
        int rc = opjit_load_op(rt, "nms", &nms);
        CHECKF(rc == OPJIT_OK && nms, "nms: %s", opjit_errmsg(rt));
        rc = opjit_load_op(rt, "mm", &mm);
        CHECKF(rc == OPJIT_OK && mm, "mm: %s", opjit_errmsg(rt));
        rc = opjit_load_op(rt, "conv2d", &conv);
        CHECKF(rc == OPJIT_OK && conv, "conv2d: %s", opjit_errmsg(rt));
        opjit_op_info oi = {.size = sizeof oi};
        if (nms && opjit_op_info_get(rt, nms, &oi) == OPJIT_OK)
            CHECK(oi.source[OPJIT_CPU] && oi.source[OPJIT_CUDA]);
        if (!nms || !mm || !conv)
            return 1;
        long base_allocs = st->live_allocs;
        int base_refs = st->primary_refs;
        /* nms */
        static const double thrs[] = {0.5, 0.0, 0.7, -0.25, 1.0, NAN};
        static const int sizes[] = {0, 1, 2, 63, 64, 65, 129, 700, 2500};
        for (int elem = 0; elem < 4; elem++) /* float32, float64, float16, bfloat16 */
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
                for (size_t ti = 0; ti < sizeof thrs / sizeof *thrs; ti++)
                    nms_agrees(rt, nms, sizes[si], elem, thrs[ti], (int)(si + ti) % 4);
        /* Sorted in 2048-element slices and 3 wide bitonic stages; tied
         * scores (mode 1) must keep their input order. */
        nms_agrees(rt, nms, 9000, 0, 0.5, 1);
        nms_agrees(rt, nms, 4097, 1, 0.3, 2);
        CHECK(st->launches > 0);
        /* Workspaces are pooled: one more call allocates nothing that stays. */
        long allocs = st->live_allocs;
        nms_agrees(rt, nms, 700, 0, 0.5, 0);
        CHECKF(st->live_allocs == allocs, "live allocations %ld -> %ld", allocs, st->live_allocs);
        /* mm */
        static const int dims[][3] = {{1, 1, 1}, {3, 5, 7}, {64, 64, 64}, {65, 17, 130},
                                      {200, 300, 100}, {0, 3, 4}, {3, 0, 4}, {3, 4, 0}};
        for (int is64 = 0; is64 < 2; is64++)
            for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
                for (int tr = 0; tr < 2; tr++)
                    mm_agrees(rt, mm, dims[i][0], dims[i][1], dims[i][2], is64, tr);
        /* mm_backward: both gradients, dense and a transposed self */
        opjit_op *mm_bw = NULL, *conv_bw = NULL;
        CHECKF(opjit_find_op(rt, "mm_backward", &mm_bw) == OPJIT_OK, "%s", opjit_errmsg(rt));
        CHECKF(opjit_find_op(rt, "conv2d_backward", &conv_bw) == OPJIT_OK, "%s",
               opjit_errmsg(rt));
        static const int bdims[][3] = {{1, 1, 1}, {5, 3, 7}, {65, 17, 130}, {3, 0, 4}, {0, 2, 3}};
        for (int is64 = 0; mm_bw && is64 < 2; is64++)
            for (size_t i = 0; i < sizeof bdims / sizeof *bdims; i++)
                for (int tr = 0; tr < 2; tr++)
                    mm_bw_agrees(rt, mm_bw, bdims[i][0], bdims[i][1], bdims[i][2], is64, tr);
        if (conv_bw)
            conv_bw_fake(rt, conv_bw);
        for (int bf = 0; bf < 2 && mm_bw && conv_bw; bf++) { /* float16, bfloat16 */
            mm_half_fake(rt, mm, mm_bw, bf);
            conv_half_fake(rt, conv, conv_bw, bf);
        }
        /* conv2d without input channels: the bias, on the device (no cuDNN). */
        {
            float bias[3] = {1.5f, -2, 4}, none = 0;
            int64_t xs[4] = {2, 0, 5, 5}, ws[4] = {3, 0, 3, 3}, bsz[1] = {3};
            DLDataType dt = {kDLFloat, 32, 1};
            void *dx = fake_dev(&none, 4), *dw = fake_dev(&none, 4), *dbias = fake_dev(bias, 12);
            DLTensor x = tensor(dx, kDLCUDA, dt, 4, xs), w = tensor(dw, kDLCUDA, dt, 4, ws),
                     b = tensor(dbias, kDLCUDA, dt, 1, bsz);
            opjit_value args[3] = {opjit_tensor(&x), opjit_tensor(&w), opjit_tensor(&b)};
            DLManagedTensor *out = NULL;
            rc = opjit_call(rt, conv, args, 3, &out, 1);
            CHECKF(rc == OPJIT_OK && out, "conv2d C=0: %s", opjit_errmsg(rt));
            if (out) {
                const float *o = out->dl_tensor.data;
                CHECK(out->dl_tensor.shape[1] == 3 && out->dl_tensor.shape[2] == 3);
                CHECK(o[0] == 1.5f && o[9] == -2 && o[18] == 4 && o[27] == 1.5f && o[53] == 4);
                out->deleter(out);
            }
            /* With channels it needs cuDNN, which cannot run on a fake
             * driver: a clean error, whatever it says. */
            int64_t xs2[4] = {1, 1, 4, 4}, ws2[4] = {1, 1, 3, 3};
            float data[16] = {0};
            void *dx2 = fake_dev(data, sizeof data), *dw2 = fake_dev(data, 36);
            DLTensor x2 = tensor(dx2, kDLCUDA, dt, 4, xs2), w2 = tensor(dw2, kDLCUDA, dt, 4, ws2);
            opjit_value a2[2] = {opjit_tensor(&x2), opjit_tensor(&w2)};
            out = NULL;
            rc = opjit_call(rt, conv, a2, 2, &out, 1);
            if (rc == OPJIT_OK)
                out->deleter(out);
            else
                CHECK_STR_CONTAINS(opjit_errmsg(rt), "conv2d");
            fake_dev_free(dx), fake_dev_free(dw), fake_dev_free(dbias);
            fake_dev_free(dx2), fake_dev_free(dw2);
        }
        /* A kernel the device code lacks is a clean error too. */
        CHECK(st->ctx_depth == 0);
        opjit_destroy(rt);
        CHECKF(st->live_allocs == base_allocs, "leaked %ld device allocations",
               st->live_allocs - base_allocs);
        CHECKF(st->primary_refs == base_refs - 1 || st->primary_refs == 0,
               "primary context references %d", st->primary_refs);
        CHECK(st->modules_loaded == st->modules_unloaded && st->modules_loaded >= 2);
        CHECK(st->ctx_depth == 0);
    } else if (!strcmp(scen, "outputs-outlive")) {
        /* An output keeps its memory and context after opjit_destroy. */
        opjit_runtime *rt = rt_new(cache, "sm_90");
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        opjit_op *mm = NULL;
        int rc = opjit_load_file(rt, path, &mm, NULL);
        CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        float a[4] = {1, 2, 3, 4};
        int64_t sh[2] = {2, 2};
        void *da = fake_dev(a, sizeof a);
        DLTensor t = tensor(da, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, sh);
        opjit_value v[2] = {opjit_tensor(&t), opjit_tensor(&t)};
        DLManagedTensor *out = NULL;
        rc = opjit_call(rt, mm, v, 2, &out, 1);
        CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
        opjit_destroy(rt);
        CHECK(st->primary_refs >= 1); /* the output's reference */
        if (out) {
            const float *o = out->dl_tensor.data;
            CHECK(o[0] == 7 && o[1] == 10 && o[2] == 15 && o[3] == 22);
            out->deleter(out);
        }
        fake_dev_free(da);
        CHECKF(st->primary_refs == 0 && st->live_allocs == 0, "refs %d allocs %ld",
               st->primary_refs, st->live_allocs);
    } else if (!strcmp(scen, "host-stream")) {
        /* The host's context and stream: used, never retained or freed. */
        static char host_ctx;
        opjit_runtime *rt = rt_new(cache, "sm_90");
        CHECK(opjit_set_cuda_stream(rt, 0, &host_ctx, (void *)(uintptr_t)0x5151) == OPJIT_OK);
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        opjit_op *mm = NULL;
        int rc = opjit_load_file(rt, path, &mm, NULL);
        CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        float a[1] = {3};
        int64_t sh[2] = {1, 1};
        void *da = fake_dev(a, sizeof a);
        int refs = st->primary_refs;
        DLTensor t = tensor(da, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, sh);
        opjit_value v[2] = {opjit_tensor(&t), opjit_tensor(&t)};
        DLManagedTensor *out = NULL;
        rc = opjit_call(rt, mm, v, 2, &out, 1);
        CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
        CHECK(st->last_pushed == &host_ctx);
        CHECK(st->primary_refs == refs);
        if (out) {
            CHECK(((float *)out->dl_tensor.data)[0] == 9);
            out->deleter(out);
        }
        /* Back to the primary context. */
        CHECK(opjit_set_cuda_stream(rt, 0, NULL, NULL) == OPJIT_OK);
        out = NULL;
        rc = opjit_call(rt, mm, v, 2, &out, 1);
        CHECKF(rc == OPJIT_OK && out, "%s", opjit_errmsg(rt));
        CHECK(st->last_pushed != &host_ctx);
        if (out)
            out->deleter(out);
        opjit_destroy(rt);
        fake_dev_free(da);
        CHECK(st->primary_refs == 0 && st->live_allocs == 0 && st->ctx_depth == 0);
    } else if (!strcmp(scen, "arch")) {
        /* QCU_ARCHS built; QCU_EXPECT: "ptx:<target>", "cubin", or an
         * error text. */
        const char *expect = getenv("QCU_EXPECT");
        opjit_runtime *rt = rt_new(cache, getenv("QCU_ARCHS"));
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        opjit_op *mm = NULL;
        int rc = opjit_load_file(rt, path, &mm, NULL);
        CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        float a[1] = {3};
        int64_t sh[2] = {1, 1};
        void *da = fake_dev(a, sizeof a);
        DLTensor t = tensor(da, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, sh);
        opjit_value v[2] = {opjit_tensor(&t), opjit_tensor(&t)};
        DLManagedTensor *out = NULL;
        rc = opjit_call(rt, mm, v, 2, &out, 1);
        if (!strncmp(expect, "ptx:", 4)) {
            CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
            CHECK(st->last_image_ptx == 1);
            CHECKF(!strcmp(expect + 4, "*") || !strcmp(st->last_image_arch, expect + 4),
                   "loaded %s", st->last_image_arch);
        } else if (!strcmp(expect, "cubin")) {
            CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
            CHECK(st->last_image_ptx == 0);
        } else {
            CHECK(rc == OPJIT_EDEVICE);
            CHECK_STR_CONTAINS(opjit_errmsg(rt), expect);
        }
        if (out)
            out->deleter(out);
        opjit_destroy(rt);
        fake_dev_free(da);
    } else if (!strcmp(scen, "mm-own")) {
        /* No cuBLAS ($OPJIT_CUBLAS_LIBRARY names no file, and the fake
         * driver is not libcuda.so.1 anyway): mm.cu runs its own kernel
         * without complaint, unless OPJIT_MM_KERNEL=cublas demands cuBLAS. */
        opjit_runtime *rt = rt_new(cache, "sm_90");
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        opjit_op *mm = NULL;
        int rc = opjit_load_file(rt, path, &mm, NULL), launches = 0;
        CHECKF(rc == OPJIT_OK && mm, "%s", opjit_errmsg(rt));
        long allocs = st->live_allocs;
        static const char *const modes[] = {NULL, "", "own"};
        for (size_t i = 0; mm && i < sizeof modes / sizeof *modes; i++) {
            if (modes[i])
                setenv("OPJIT_MM_KERNEL", modes[i], 1);
            else
                unsetenv("OPJIT_MM_KERNEL");
            /* row-major, transposed, broadcast rows */
            static const int64_t strides[][2] = {{3, 1}, {1, 2}, {0, 1}};
            for (size_t j = 0; j < sizeof strides / sizeof *strides; j++) {
                rc = fake_mm(rt, mm, st, strides[j][0], strides[j][1], &launches);
                CHECKF(rc == OPJIT_OK && launches == 1, "OPJIT_MM_KERNEL=%s: %s",
                       modes[i] ? modes[i] : "(unset)", opjit_errmsg(rt));
            }
        }
        setenv("OPJIT_MM_KERNEL", "cublas", 1);
        rc = mm ? fake_mm(rt, mm, st, 3, 1, &launches) : OPJIT_OK;
        CHECK(rc != OPJIT_OK && launches == 0);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "cuBLAS is not available");
        /* ... which an empty product does not need. */
        {
            float none = 0;
            int64_t as[2] = {2, 0}, bs[2] = {0, 2};
            void *d0 = fake_dev(&none, 4);
            DLTensor ta = tensor(d0, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, as);
            DLTensor tb = tensor(d0, kDLCUDA, (DLDataType){kDLFloat, 32, 1}, 2, bs);
            opjit_value v[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
            DLManagedTensor *out = NULL;
            rc = mm ? opjit_call(rt, mm, v, 2, &out, 1) : OPJIT_EINVAL;
            CHECKF(rc == OPJIT_OK && out, "k = 0: %s", opjit_errmsg(rt));
            if (out) {
                const float *o = out->dl_tensor.data;
                CHECK(out->dl_tensor.shape[0] == 2 && out->dl_tensor.shape[1] == 2);
                CHECK(o[0] == 0 && o[1] == 0 && o[2] == 0 && o[3] == 0);
                out->deleter(out);
            }
            fake_dev_free(d0);
        }
        setenv("OPJIT_MM_KERNEL", "tf32", 1);
        rc = mm ? fake_mm(rt, mm, st, 3, 1, &launches) : OPJIT_OK;
        CHECK(rc != OPJIT_OK);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "OPJIT_MM_KERNEL");
        unsetenv("OPJIT_MM_KERNEL");
        CHECK(st->live_allocs == allocs);
        opjit_destroy(rt);
    } else if (!strcmp(scen, "mm-foreign-driver")) {
        /* cuBLAS may be installed, but calls run on a driver that is not
         * libcuda.so.1 (the fake): cuBLAS would run on another one (the
         * GPU's, where there is one) and could not see the fake's memory.
         * The loader does not load it and mm.cu runs its own kernel. */
        opjit_runtime *rt = rt_new(cache, "sm_90");
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        opjit_op *mm = NULL;
        int rc = opjit_load_file(rt, path, &mm, NULL), launches = 0;
        CHECKF(rc == OPJIT_OK && mm, "%s", opjit_errmsg(rt));
        CHECK(dlsym(RTLD_DEFAULT, "cublasCreate_v2") == NULL);
        for (int i = 0; mm && i < 2; i++) {
            rc = fake_mm(rt, mm, st, 3, 1, &launches);
            CHECKF(rc == OPJIT_OK && launches == 1, "call %d: %s", i, opjit_errmsg(rt));
        }
        setenv("OPJIT_MM_KERNEL", "cublas", 1);
        rc = mm ? fake_mm(rt, mm, st, 3, 1, &launches) : OPJIT_OK;
        CHECK(rc != OPJIT_OK && launches == 0);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "not libcuda.so.1");
        unsetenv("OPJIT_MM_KERNEL");
        CHECK(dlsym(RTLD_DEFAULT, "cublasCreate_v2") == NULL);
        opjit_destroy(rt);
    } else if (!strcmp(scen, "default-archs")) {
        /* No list given: this GPU's architecture only. */
        opjit_runtime *rt = rt_new(cache, NULL);
        snprintf(path, sizeof path, "%s/mm.cu", ops_dir());
        int rc = opjit_load_file(rt, path, NULL, NULL);
        CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        opjit_destroy(rt);
        CHECK(count_named(cache, "sm_86.cubin") == 1);
        CHECK(count_named(cache, "sm_90.cubin") == 0);
        CHECK(count_named(cache, "compute_90.ptx") == 0);
    }
    CHECKF(st->errors == 0, "the fake driver saw %d protocol violations; the first: %s",
           st->errors, st->first_error);
    tmpdirs_remove();
    return t_failed_checks ? 1 : 0;
}

/* Build tests/fake_libcuda.c into dir/libfakecuda.so (so); 0 when it
 * cannot be (no $OPJIT_CC: skipped with a note; a failed build: a failed
 * check). */
static int fake_driver_build(const char *dir, char *so, size_t n)
{
    const char *cc = getenv("OPJIT_CC"), *src = getenv("OPJIT_SOURCE_DIR");
    if (!cc || !*cc || !src) {
        fprintf(stderr, "note: no OPJIT_CC/OPJIT_SOURCE_DIR: the fake-driver checks are skipped\n");
        return 0;
    }
    char cmd[4096];
    snprintf(so, n, "%s/libfakecuda.so", dir);
    snprintf(cmd, sizeof cmd, "'%s' -shared -fPIC -O1 -ffp-contract=off -o '%s' '%s/tests/fake_libcuda.c'",
             cc, so, src);
    int rc = system(cmd);
    CHECKF(rc == 0, "cannot build the fake driver: %s", cmd);
    return rc == 0;
}

static void fake_driver_runs_the_cuda_path(void)
{
    if (!nvrtc_here())
        return;
    const char *d = tmpdir_new();
    char so[1024];
    if (!fake_driver_build(d, so, sizeof so))
        return;
    char drv[1100], cache[1100], cc_env[64];
    snprintf(drv, sizeof drv, "OPJIT_CUDA_DRIVER=%s", so);
    snprintf(cache, sizeof cache, "QCU_CACHE=%s/cache", d);
    struct {
        const char *scenario, *cc, *archs, *expect, *extra;
    } runs[] = {
        {"ops", "90", NULL, NULL, NULL},
        {"outputs-outlive", "90", NULL, NULL, NULL},
        {"host-stream", "90", NULL, NULL, NULL},
        {"arch", "90", "sm_80,sm_90,compute_80", "cubin", NULL},
        /* sm_86: no cubin for it; the highest PTX not above it. */
        {"arch", "86", "sm_80,sm_90,compute_80,compute_90", "ptx:sm_80", NULL},
        /* ... a same-major cubin when there is no PTX. */
        {"arch", "86", "sm_80,sm_90", "cubin", NULL},
        {"arch", "86", "sm_90,compute_90", "no device code this GPU can run", NULL},
        {"arch", "90", "compute_90", "driver too old for this PTX", "FAKE_CUDA_REJECT_PTX=222"},
        {"default-archs", "86", NULL, NULL, NULL},
        /* A GPU newer than NVRTC: by default, NVRTC's highest PTX. */
        {"arch", "200", NULL, "ptx:*", NULL},
        {"bad-kernel", "90", NULL, NULL, NULL},
        {"shared", "90", NULL, NULL, NULL},
        {"no-device", "90", NULL, NULL, "FAKE_CUDA_DEVICES=0"},
        {"mm-own", "90", NULL, NULL, NULL},
        {"mm-foreign-driver", "90", NULL, NULL, "OPJIT_CUBLAS_LIBRARY"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char scen[64], archs[128], expect[128];
        snprintf(cc_env, sizeof cc_env, "FAKE_CUDA_CC=%s", runs[i].cc);
        snprintf(scen, sizeof scen, "QCU_SCENARIO=%s", runs[i].scenario);
        snprintf(archs, sizeof archs, "QCU_ARCHS=%s", runs[i].archs ? runs[i].archs : "");
        snprintf(expect, sizeof expect, "QCU_EXPECT=%s", runs[i].expect ? runs[i].expect : "");
        if (!strcmp(runs[i].scenario, "default-archs"))
            snprintf(cache, sizeof cache, "QCU_CACHE=%s/cache-default", d);
        /* No real cuBLAS beside the fake GPU, unless extra says otherwise. */
        const char *env[] = {drv, cache, cc_env, scen, archs, expect, "OPJIT_CUDA_ARCHS",
                             "OPJIT_MM_KERNEL", "OPJIT_CUBLAS_LIBRARY=/nonexistent/libcublas.so.13",
                             runs[i].extra ? runs[i].extra : "FAKE_CUDA_REJECT_PTX", NULL};
        int st = run_child("--child-fake-driver", env);
        CHECKF(st == 0, "fake driver, scenario %s (sm_%s, %s) exited %d", runs[i].scenario,
               runs[i].cc, runs[i].archs ? runs[i].archs : "default", st);
    }
}

/* Where dlopen would look for libcuda.so.1 and nothing is there, the
 * driver is not dlopened (glibc's search of some 90 places, 120 us); a
 * cache or a directory that has it, or $LD_LIBRARY_PATH, lets dlopen look. */
static void driver_looked_for_only_where_it_can_be(void)
{
    const char *d = tmpdir_new();
    char cache[1100], other[1100], with[1100], lib[1200];
    snprintf(cache, sizeof cache, "%s/ld.so.cache", d);
    snprintf(other, sizeof other, "%s/other.cache", d);
    snprintf(with, sizeof with, "%s/libdir", d);
    static const char no[] = "glibc-ld.so.cache1.1\0libm.so.6\0/lib/libm.so.6\0libcuda.so.10\0";
    static const char yes[] = "glibc-ld.so.cache1.1\0libcuda.so.1\0/usr/lib/libcuda.so.1\0";
    FILE *f = fopen(cache, "wb");
    CHECK(f && fwrite(no, 1, sizeof no, f) == sizeof no);
    if (f)
        fclose(f);
    f = fopen(other, "wb");
    CHECK(f && fwrite(yes, 1, sizeof yes, f) == sizeof yes);
    if (f)
        fclose(f);
    const char *none[] = {d, NULL}, *dirs[] = {d, with, NULL};
    CHECK(cuda_driver_findable(NULL, cache, none) == 0);
    CHECK(cuda_driver_findable("", cache, none) == 0);
    CHECK(cuda_driver_findable("/somewhere", cache, none) == 1);
    CHECK(cuda_driver_findable(NULL, other, none) == 1);
    CHECK(cuda_driver_findable(NULL, pjoin(d, "no-such-cache"), none) == 1); /* cannot tell */
    CHECK(mkdir(with, 0700) == 0);
    snprintf(lib, sizeof lib, "%s/libcuda.so.1", with);
    f = fopen(lib, "wb");
    if (f)
        fclose(f);
    CHECK(cuda_driver_findable(NULL, cache, dirs) == 1);
}

/* The driver found by name through $LD_LIBRARY_PATH (no $OPJIT_CUDA_DRIVER):
 * the fake one, as libcuda.so.1. */
static int child_driver_by_name(void)
{
    char why[1024] = "";
    int rc = cuda_available(why, sizeof why);
    if (rc)
        fprintf(stderr, "cuda_available: %s\n", why);
    return rc == OPJIT_OK ? 0 : 1;
}

static void driver_found_through_ld_library_path(void)
{
    const char *d = tmpdir_new();
    char so[1024], dir[1100], link[1200], path[8192];
    if (!fake_driver_build(d, so, sizeof so))
        return;
    snprintf(dir, sizeof dir, "%s/lib", d);
    snprintf(link, sizeof link, "%s/libcuda.so.1", dir);
    CHECK(mkdir(dir, 0700) == 0 && symlink(so, link) == 0);
    /* before the directories the build's own libraries may need */
    const char *keep = getenv("LD_LIBRARY_PATH");
    snprintf(path, sizeof path, "LD_LIBRARY_PATH=%s%s%s", dir, keep ? ":" : "", keep ? keep : "");
    const char *env[] = {path, "OPJIT_CUDA_DRIVER", "FAKE_CUDA_CC=90", NULL};
    CHECK(run_child("--child-driver-by-name", env) == 0);
}

/* Counts what cfg.alloc hands out, to see copies come from it. */
static long counting_live;
static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud, (void)osize;
    if (!nsize) {
        if (ptr)
            counting_live--;
        free(ptr);
        return NULL;
    }
    if (!ptr)
        counting_live++;
    return realloc(ptr, nsize);
}

/* In this process: no fake driver, so the real one (absent without a GPU). */
static void tensor_to_device_on_the_host(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.alloc = counting_alloc;
    cfg.tiering = 0;
    cfg.cache_dir = pjoin(tmpdir_new(), "cache");
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK && rt);
    if (!rt)
        return;
    /* CPU to CPU, every case: needs no driver. */
    size_t ncases = sizeof round_trip_cases / sizeof *round_trip_cases;
    for (size_t i = 0; i < ncases; i++)
        round_trip(rt, &round_trip_cases[i], OPJIT_CPU, 0);

    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t sh[2] = {2, 3}, tr[2] = {1, 2};
    DLDataType f32 = {kDLFloat, 32, 1};
    DLTensor h = tensor(v, kDLCPU, f32, 2, sh);
    DLManagedTensor *out = NULL;
    long live = counting_live;
    CHECK(opjit_tensor_to_device(rt, &h, OPJIT_CPU, 0, &out) == OPJIT_OK && out);
    CHECK(counting_live == live + 1); /* one block, from cfg.alloc */
    opjit_destroy(rt);
    if (out) { /* it outlives the runtime */
        CHECK(!memcmp(out->dl_tensor.data, v, sizeof v));
        out->deleter(out);
    }
    CHECK(counting_live == live);
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK && rt);
    if (!rt)
        return;

    /* Refusals: EINVAL with a message, *out NULL. */
    struct {
        const char *what, *msg;
        int device, id, dltype, bits, lanes, strided;
    } bad[] = {
        {"strided", "not contiguous", OPJIT_CPU, 0, kDLCPU, 32, 1, 1},
        {"strided to cuda", "not contiguous", OPJIT_CUDA, 0, kDLCPU, 32, 1, 1},
        {"bad device", "bad device 7", 7, 0, kDLCPU, 32, 1, 0},
        {"cpu id 1", "bad device id 1 for cpu", OPJIT_CPU, 1, kDLCPU, 32, 1, 0},
        {"cuda id -1", "bad device id -1 for cuda", OPJIT_CUDA, -1, kDLCPU, 32, 1, 0},
        {"rocm source", "rocm", OPJIT_CPU, 0, kDLROCM, 32, 1, 0},
        {"4-bit dtype", "whole bytes", OPJIT_CPU, 0, kDLCPU, 4, 1, 0},
        {"0 lanes", "whole bytes", OPJIT_CPU, 0, kDLCPU, 32, 0, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        DLTensor t = tensor(v, bad[i].dltype, (DLDataType){kDLFloat, (uint8_t)bad[i].bits,
                                                            (uint16_t)bad[i].lanes}, 2, sh);
        if (bad[i].strided)
            t.strides = tr;
        out = (DLManagedTensor *)&t;
        int rc = opjit_tensor_to_device(rt, &t, bad[i].device, bad[i].id, &out);
        CHECKF(rc == OPJIT_EINVAL && out == NULL, "%s: got %s", bad[i].what,
               opjit_status_name(rc));
        CHECK_STR_CONTAINS(opjit_errmsg(rt), bad[i].msg);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "opjit_tensor_to_device");
    }
    int64_t neg[2] = {2, -3};
    DLTensor t = tensor(v, kDLCPU, f32, 2, neg);
    CHECK(opjit_tensor_to_device(rt, &t, OPJIT_CPU, 0, &out) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "bad size -3 in dim 1");
    t = tensor(NULL, kDLCPU, f32, 2, sh);
    CHECK(opjit_tensor_to_device(rt, &t, OPJIT_CPU, 0, &out) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "no data");
    CHECK(opjit_tensor_to_device(rt, NULL, OPJIT_CPU, 0, &out) == OPJIT_EINVAL);
    CHECK(opjit_tensor_to_device(rt, &h, OPJIT_CPU, 0, NULL) == OPJIT_EINVAL);
    CHECK(opjit_tensor_to_device(NULL, &h, OPJIT_CPU, 0, &out) == OPJIT_EINVAL);
    CHECK(counting_live == live);

    /* No driver: the call path's reason, both ways. */
    char why[1024] = "";
    if (cuda_available(why, sizeof why) == OPJIT_OK) {
        fprintf(stderr, "note: a GPU is here; the no-driver checks are skipped\n");
    } else {
        CHECKF(strstr(why, "no libcuda.so.1") || strstr(why, "no CUDA device"), "%s", why);
        out = (DLManagedTensor *)&h;
        int rc = opjit_tensor_to_device(rt, &h, OPJIT_CUDA, 0, &out);
        CHECKF(rc == OPJIT_EDEVICE && out == NULL, "got %s", opjit_status_name(rc));
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "cannot copy to CUDA device 0");
        CHECK_STR_CONTAINS(opjit_errmsg(rt), why);
        DLTensor g = tensor((void *)(uintptr_t)0x100000, kDLCUDA, f32, 2, sh);
        out = (DLManagedTensor *)&h;
        rc = opjit_tensor_to_device(rt, &g, OPJIT_CPU, 0, &out);
        CHECKF(rc == OPJIT_EDEVICE && out == NULL, "got %s", opjit_status_name(rc));
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "cannot copy from CUDA device 0");
        CHECK_STR_CONTAINS(opjit_errmsg(rt), why);
        CHECK(counting_live == live);
    }
    opjit_destroy(rt);
}

/* The fake driver (no NVRTC needed): round trips through two GPUs, the
 * copies' memory and contexts; and a driver without devices. */
static void tensor_to_device_with_fake_driver(void)
{
    const char *d = tmpdir_new();
    char so[1024];
    if (!fake_driver_build(d, so, sizeof so))
        return;
    char drv[1100], cache[1100];
    snprintf(drv, sizeof drv, "OPJIT_CUDA_DRIVER=%s", so);
    snprintf(cache, sizeof cache, "QCU_CACHE=%s/cache", d);
    const char *env[] = {drv, cache, "FAKE_CUDA_CC=90", "FAKE_CUDA_DEVICES=2",
                         "QCU_SCENARIO=to-device", NULL};
    int st = run_child("--child-fake-driver", env);
    CHECKF(st == 0, "fake driver, scenario to-device exited %d", st);
    const char *env0[] = {drv, cache, "FAKE_CUDA_DEVICES=0", "QCU_SCENARIO=to-device-nodev",
                          NULL};
    st = run_child("--child-fake-driver", env0);
    CHECKF(st == 0, "fake driver, scenario to-device-nodev exited %d", st);
}

int main(int argc, char **argv)
{
    self_exe = argv[0][0] == '/' ? argv[0] : realpath(argv[0], NULL);
    if (argc > 1 && !strcmp(argv[1], "--child-no-nvrtc"))
        return child_no_nvrtc();
    if (argc > 1 && !strcmp(argv[1], "--child-fake-driver"))
        return child_fake_driver();
    if (argc > 1 && !strcmp(argv[1], "--child-warm-hit"))
        return child_warm_hit();
    if (argc > 1 && !strcmp(argv[1], "--child-cublas-direct"))
        return child_cublas_direct();
    if (argc > 1 && !strcmp(argv[1], "--child-driver-by-name"))
        return child_driver_by_name();
    T_RUN(nvrtc_compiles_every_shipped_op);
    T_RUN(device_errors_carry_file_and_line);
    T_RUN(cache_keeps_each_arch);
    T_RUN(default_archs_without_gpu);
    T_RUN(shipped_ops_load_beside_their_twins);
    T_RUN(schema_mismatch_names_both_files);
    T_RUN(cuda_call_without_driver_fails_cleanly);
    T_RUN(by_name_loads_cpu_only_without_cuda);
    T_RUN(missing_nvrtc_is_a_clear_error);
    T_RUN(warm_hits_do_not_load_nvrtc);
    T_RUN(cublas_callers_load);
    T_RUN(fake_driver_runs_the_cuda_path);
    T_RUN(tensor_to_device_on_the_host);
    T_RUN(tensor_to_device_with_fake_driver);
    T_RUN(driver_looked_for_only_where_it_can_be);
    T_RUN(driver_found_through_ld_library_path);
    tmpdirs_remove();
    if (self_exe != argv[0])
        free((void *)self_exe);
    return t_done();
}
