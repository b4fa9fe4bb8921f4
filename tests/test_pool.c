/* tests/test_pool.c - threads for op code: opjit_parallel_for from both
 * tiers, the pool's lazy start (counted in /proc/self/task), the thread
 * count's sources, a host-supplied pool, chunk failures and their
 * messages, nested loops, many host threads calling at once, and every
 * shipped CPU op giving the same bits at 1, 2 and 7 threads in both tiers.
 * The pool's threads are counted in /proc/self/task by their name.
 *
 * No timing assertions: a chunk that waits a little gives the workers time
 * to wake, but nothing checks how long anything took. */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"

/* par_probe(x, grain, fail_at, mode) -> (y, slot): y = 2x + 1 and the slot
 * (opjit_thread_num) that computed each element, over chunks of grain.
 * fail_at: the chunk holding that index fails with a message. mode 1: a
 * nested loop inside each chunk computes it; 2: a chunk asks for an output
 * (not allowed); 3: a chunk fails without a message; 4: each chunk waits
 * 2 ms first, so the workers wake and take some. */
static const char probe_source[] =
    "#include <opjit_op.h>\n"
    "#include <string.h>\n"
    "#include <unistd.h>\n"
    "typedef struct job { opjit_ctx *ctx; const float *x; float *y; int32_t *slot;\n"
    "                     int64_t fail_at; int64_t mode; } job;\n"
    "static int inner(void *u, int64_t lo, int64_t hi)\n"
    "{\n"
    "    job *j = (job *)u;\n"
    "    for (int64_t i = lo; i < hi; i++) {\n"
    "        j->y[i] = j->x[i] * 2 + 1;\n"
    "        j->slot[i] = opjit_thread_num(j->ctx);\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
    "static int chunk(void *u, int64_t lo, int64_t hi)\n"
    "{\n"
    "    job *j = (job *)u;\n"
    "    if (j->fail_at >= lo && j->fail_at < hi)\n"
    "        return opjit_fail(j->ctx, \"chunk [%lld, %lld) failed on purpose\",\n"
    "                          (long long)lo, (long long)hi);\n"
    "    if (j->mode == 2) {\n"
    "        int64_t s[1] = {1};\n"
    "        if (!opjit_output(j->ctx, 0, OPJIT_FLOAT32, 1, s))\n"
    "            return -1;\n"
    "    }\n"
    "    if (j->mode == 3)\n"
    "        return 7;\n"
    "    if (j->mode == 4)\n"
    "        usleep(2000);\n"
    "    if (j->mode == 1)\n"
    "        return opjit_parallel_for(j->ctx, lo, hi, 1, inner, j);\n"
    "    return inner(j, lo, hi);\n"
    "}\n"
    "static int k(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    DLTensor *y = opjit_output(ctx, 0, OPJIT_FLOAT32, 1, x->shape);\n"
    "    DLTensor *s = opjit_output(ctx, 1, OPJIT_INT32, 1, x->shape);\n"
    "    job j;\n"
    "    if (!y || !s)\n"
    "        return -1;\n"
    "    j.ctx = ctx;\n"
    "    j.x = (const float *)opjit_data(x);\n"
    "    j.y = (float *)y->data;\n"
    "    j.slot = (int32_t *)s->data;\n"
    "    j.fail_at = opjit_arg_int(a, 2);\n"
    "    j.mode = opjit_arg_int(a, 3);\n"
    "    if (opjit_num_threads(ctx) < 1)\n"
    "        return opjit_fail(ctx, \"num_threads < 1\");\n"
    "    return opjit_parallel_for(ctx, 0, x->shape[0], opjit_arg_int(a, 1), chunk, &j);\n"
    "}\n"
    "OPJIT_MODULE(par_probe, m)\n"
    "{\n"
    "    opjit_def(m, \"par_probe(Tensor x, int grain=1, int fail_at=-1, int mode=0) -> \"\n"
    "                 \"(Tensor, Tensor)\", OPJIT_CPU, k, \"\");\n"
    "    opjit_require(m, \"x\", \"float32 rank=1 contiguous\");\n"
    "}\n";

static const char *dir, *probe_path;

/* Threads of this process whose name starts with comm (NULL: every
 * thread), counted in /proc/self/task. */
static int count_tasks(const char *comm)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char path[300], name[64] = "";
        if (e->d_name[0] == '.')
            continue;
        if (!comm) {
            n++;
            continue;
        }
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(name, sizeof name, f) && !strncmp(name, comm, strlen(comm)))
            n++;
        if (f)
            fclose(f);
    }
    closedir(d);
    return n;
}

/* The pool's threads, named opjit-worker (a sanitizer's own threads do
 * not count). */
static int tasks_now(void) { return count_tasks("opjit-worker"); }

static opjit_runtime *new_rt(int threads, int tiering, opjit_pool_fn pool, void *pool_ud)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.num_threads = threads;
    cfg.tiering = tiering;
    cfg.pool = pool;
    cfg.pool_ud = pool_ud;
    opjit_runtime *rt = NULL;
    int rc = opjit_create(&cfg, &rt);
    if (rc) {
        fprintf(stderr, "opjit_create: %s\n", opjit_status_name(rc));
        exit(1);
    }
    return rt;
}

static opjit_op *load(opjit_runtime *rt, const char *spec)
{
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, spec, &op);
    CHECKF(rc == OPJIT_OK, "load %s: %s", spec, opjit_errmsg(rt));
    return op;
}

#define PN 4000
static float px[PN];
static int64_t pshape[1] = {PN};
static DLTensor pt = {px, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, pshape, NULL, 0};

/* One call of par_probe; on success checks y and returns how many distinct
 * slots computed it (slots must be below num_threads), else -status. */
static int probe(opjit_runtime *rt, opjit_op *op, int64_t grain, int64_t fail_at, int64_t mode)
{
    opjit_value a[4] = {opjit_tensor(&pt), opjit_int(grain), opjit_int(fail_at), opjit_int(mode)};
    DLManagedTensor *o[2] = {NULL, NULL};
    int rc = opjit_call(rt, op, a, 4, o, 2);
    if (rc)
        return -rc;
    int nt = 0, seen[1024] = {0}, distinct = 0, bad = 0;
    opjit_num_threads_get(rt, &nt);
    const float *y = o[0]->dl_tensor.data;
    const int32_t *s = o[1]->dl_tensor.data;
    for (int i = 0; i < PN; i++) {
        bad += y[i] != px[i] * 2 + 1 || s[i] < 0 || s[i] >= nt || s[i] >= 1024;
        if (!bad && !seen[s[i]]++)
            distinct++;
    }
    o[0]->deleter(o[0]);
    o[1]->deleter(o[1]);
    return bad ? -1000 - bad : distinct;
}

static void *no_op(void *arg) { return arg; }

/* mm of two 2 x 2 float64 matrices, a path through OpenBLAS in either
 * tier (op_blas.h): 0 when it ran and gave the right product. */
static int mm_f64(opjit_runtime *rt, opjit_op *op)
{
    double a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    int64_t shape[2] = {2, 2};
    DLTensor ta = {a, {kDLCPU, 0}, 2, {kDLFloat, 64, 1}, shape, NULL, 0}, tb = ta;
    tb.data = b;
    opjit_value args[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op, args, 2, &out, 1);
    if (rc)
        return rc;
    const double *c = out->dl_tensor.data;
    int bad = c[0] != 19 || c[1] != 22 || c[2] != 43 || c[3] != 50;
    out->deleter(out);
    return bad ? -1 : 0;
}

static int blas_loaded(void)
{
    void *h = dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

/* OpenBLAS starts a server thread per extra core when it is loaded, and
 * each spins for about 0.1 s: an OpenBLAS that opjit brings in has them
 * stopped (OpenBLAS runs one thread per call under opjit), one the host
 * loaded first keeps them. The shipped mm asks for OpenBLAS through
 * opjit_blas: loading it loads no OpenBLAS, the first call that needs
 * it does. Run first, before anything in this process has loaded
 * OpenBLAS; the host's case in a child. */
static void blas_threads_case(int host_loads_first)
{
    /* A thread made and joined first: TSan starts its own background
     * thread at a process's first pthread_create, which must not land
     * between the two counts. */
    pthread_t t;
    if (pthread_create(&t, NULL, no_op, NULL) == 0)
        pthread_join(t, NULL);
    int before = count_tasks(NULL), host = 0;
    if (host_loads_first) {
        void *h = dlopen("libopenblas.so.0", RTLD_NOW);
        CHECKF(h != NULL, "dlopen libopenblas.so.0: %s", dlerror());
        host = count_tasks(NULL) - before;
    }
    opjit_runtime *rt = new_rt(2, 0, NULL, NULL);
    opjit_op *op = load(rt, "mm");
    if (!host_loads_first)
        CHECKF(!blas_loaded(), "loading mm loaded OpenBLAS");
    CHECKF(op && mm_f64(rt, op) == 0, "mm in float64: %s", opjit_errmsg(rt));
    CHECKF(blas_loaded(), "a float64 mm ran without OpenBLAS loaded");
    int after = count_tasks(NULL);
    opjit_destroy(rt);
    if (host_loads_first)
        CHECKF(after == before + host, "the host's OpenBLAS had %d thread(s), %d after the load",
               host, after - before);
    else
        CHECKF(after == before, "%d thread(s) after loading mm (OpenBLAS's left running), %d "
               "before", after, before);
}

static void test_blas_threads(void)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
        printf("  one CPU: OpenBLAS starts no threads, nothing to stop\n");
    pid_t pid = fork();
    if (pid == 0) {
        blas_threads_case(1);
        _exit(t_failed_checks == 0 ? 0 : 1);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the host-loads-OpenBLAS child failed (%#x)", st);
    blas_threads_case(0);
}

static void test_lazy_start(void)
{
    int before = tasks_now();
    opjit_runtime *rt = new_rt(4, 0, NULL, NULL);
    opjit_op *op = load(rt, probe_path);
    CHECKF(tasks_now() == before, "%d threads after create and load, %d before", tasks_now(),
           before);
    /* one chunk: runs on the caller, nothing starts */
    CHECK(probe(rt, op, PN, -1, 0) == 1);
    CHECKF(tasks_now() == before, "a one-chunk loop started threads (%d, %d before)",
           tasks_now(), before);
    int d = probe(rt, op, 100, -1, 4);
    CHECKF(d >= 2, "40 slow chunks ran on %d thread(s)", d);
    CHECKF(tasks_now() == before + 3, "%d threads after a parallel call, %d before (want +3)",
           tasks_now(), before);
    opjit_destroy(rt);
    CHECKF(tasks_now() == before, "%d threads after destroy, %d before", tasks_now(), before);
    /* one thread: never a worker */
    rt = new_rt(1, 0, NULL, NULL);
    op = load(rt, probe_path);
    CHECK(probe(rt, op, 10, -1, 0) == 1);
    CHECK(tasks_now() == before);
    opjit_destroy(rt);
}

static void test_both_tiers(void)
{
    for (int tiering = 0; tiering <= 1; tiering++) {
        opjit_runtime *rt = new_rt(3, tiering, NULL, NULL);
        opjit_op *op = load(rt, probe_path);
        if (tiering)
            CHECKF(opjit_wait(rt) == OPJIT_OK, "opjit_wait: %s", opjit_errmsg(rt));
        opjit_op_info info = {.size = sizeof info};
        CHECK(op && opjit_op_info_get(rt, op, &info) == OPJIT_OK);
        if (op)
            CHECK_STR_CONTAINS(info.tier[OPJIT_CPU], tiering ? "opt" : "tcc");
        int d = probe(rt, op, 100, -1, 4);
        CHECKF(d >= 2, "tier %d: slow chunks ran on %d thread(s)", tiering, d);
        CHECKF(probe(rt, op, 7, -1, 1) >= 1, "tier %d: nested loops", tiering);
        CHECK(probe(rt, op, 1, -1, 0) >= 1);  /* 4000 chunks of one */
        CHECK(probe(rt, op, 0, -1, 0) >= 1);  /* grain < 1 is 1 */
        CHECK(probe(rt, op, 1 << 30, -1, 0) == 1);
        opjit_destroy(rt);
    }
}

static void test_chunk_failures(void)
{
    opjit_runtime *rt = new_rt(4, 0, NULL, NULL);
    opjit_op *op = load(rt, probe_path);
    CHECK(probe(rt, op, 8, 37, 0) == -OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "par_probe: chunk [32, 40) failed on purpose");
    CHECK(probe(rt, op, 8, 37, 1) == -OPJIT_EKERNEL); /* nested: same report */
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "failed on purpose");
    CHECK(probe(rt, op, 8, -1, 3) == -OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "failed (returned 7) without a message");
    CHECK(probe(rt, op, 8, -1, 2) == -OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "opjit_output: not allowed inside a parallel_for chunk");
    CHECK(probe(rt, op, 8, -1, 0) >= 1); /* and then calls work again */
    CHECK(probe(rt, op, PN, 5, 0) == -OPJIT_EKERNEL); /* one chunk, inline: same message */
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "chunk [0, 4000) failed on purpose");
    opjit_destroy(rt);
}

/* A host pool: ntasks - 1 fresh threads plus the caller, or a refusal. */
typedef struct host_pool {
    atomic_int calls, refuse, max_tasks;
} host_pool;

typedef struct host_task {
    opjit_task_fn fn;
    void *arg;
    int i;
} host_task;

static void *host_thread(void *p)
{
    host_task *t = p;
    t->fn(t->arg, t->i);
    return NULL;
}

static int host_pool_run(void *ud, int ntasks, opjit_task_fn fn, void *arg)
{
    host_pool *hp = ud;
    atomic_fetch_add(&hp->calls, 1);
    if (atomic_load(&hp->refuse))
        return -1;
    if (ntasks > atomic_load(&hp->max_tasks))
        atomic_store(&hp->max_tasks, ntasks);
    pthread_t th[64];
    host_task tk[64];
    int started = 0;
    for (int i = 1; i < ntasks && i < 64; i++) {
        tk[i] = (host_task){fn, arg, i};
        if (pthread_create(&th[i], NULL, host_thread, &tk[i]) == 0)
            started = i;
        else
            break;
    }
    fn(arg, 0);
    for (int i = started + 1; i < ntasks; i++) /* could not start: run here */
        fn(arg, i);
    for (int i = 1; i <= started; i++)
        pthread_join(th[i], NULL);
    return 0;
}

static void test_host_pool(void)
{
    static host_pool hp;
    int before = tasks_now();
    opjit_runtime *rt = new_rt(3, 0, host_pool_run, &hp);
    opjit_op *op = load(rt, probe_path);
    int d = probe(rt, op, 100, -1, 4);
    CHECKF(d >= 2, "the host pool ran the chunks on %d thread(s)", d);
    CHECK(atomic_load(&hp.calls) == 1);
    CHECK(atomic_load(&hp.max_tasks) == 3);
    CHECK(probe(rt, op, 8, 37, 0) == -OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "chunk [32, 40) failed on purpose");
    CHECK(probe(rt, op, PN, -1, 0) == 1); /* one chunk: the pool is not asked */
    CHECK(atomic_load(&hp.calls) == 2);
    atomic_store(&hp.refuse, 1);
    CHECK(probe(rt, op, 100, -1, 0) == 1); /* refused: all on the caller */
    CHECK(atomic_load(&hp.calls) == 3);
    opjit_destroy(rt);
    CHECK(tasks_now() == before);
}

static void test_thread_count(void)
{
    int n = 0;
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    int cpus = CPU_COUNT(&set);
    const char *old = getenv("OPJIT_NUM_THREADS");
    char saved[64] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    unsetenv("OPJIT_NUM_THREADS");
    opjit_runtime *rt = new_rt(0, 0, NULL, NULL);
    CHECK(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == cpus);
    opjit_destroy(rt);
    setenv("OPJIT_NUM_THREADS", "3", 1);
    rt = new_rt(0, 0, NULL, NULL);
    CHECK(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == 3);
    opjit_destroy(rt);
    rt = new_rt(5, 0, NULL, NULL); /* the config wins */
    CHECK(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == 5);
    opjit_destroy(rt);
    setenv("OPJIT_NUM_THREADS", "two", 1); /* ignored */
    rt = new_rt(0, 0, NULL, NULL);
    CHECK(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == cpus);
    CHECK(opjit_num_threads_get(NULL, &n) == OPJIT_EINVAL);
    CHECK(opjit_num_threads_get(rt, NULL) == OPJIT_EINVAL);
    opjit_destroy(rt);
    if (old)
        setenv("OPJIT_NUM_THREADS", saved, 1);
    else
        unsetenv("OPJIT_NUM_THREADS");
}

/* ---- many host threads, one pool ----------------------------------------------- */

static atomic_int host_failures;
static opjit_runtime *shared_rt;
static opjit_op *shared_op;

static void *host_caller(void *arg)
{
    long id = (long)arg;
    for (int i = 0; i < 30; i++) {
        int64_t grain = 1 + (id * 7 + i) % 300;
        int r = probe(shared_rt, shared_op, grain, -1, (id + i) % 2);
        if (r < 1)
            atomic_fetch_add(&host_failures, 1);
        if (i % 10 == 0 && probe(shared_rt, shared_op, 16, 100 + id, 0) != -OPJIT_EKERNEL)
            atomic_fetch_add(&host_failures, 1);
    }
    return NULL;
}

static void test_many_host_threads(void)
{
    shared_rt = new_rt(3, 0, NULL, NULL);
    shared_op = load(shared_rt, probe_path);
    pthread_t th[8];
    for (long i = 0; i < 8; i++)
        CHECK(pthread_create(&th[i], NULL, host_caller, (void *)i) == 0);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    CHECKF(atomic_load(&host_failures) == 0, "%d calls from host threads went wrong",
           atomic_load(&host_failures));
    opjit_destroy(shared_rt);
}

/* ---- the shipped ops: the same bits at 1, 2 and 7 threads -------------------------- */

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

typedef struct tensor {
    DLTensor t;
    int64_t shape[4], strides[4];
    void *data;
} tensor;

static void tensor_init(tensor *x, int bits, int ndim, const int64_t *shape, int nms_boxes)
{
    size_t n = 1;
    memset(x, 0, sizeof *x);
    for (int i = 0; i < ndim; i++)
        n *= (size_t)(x->shape[i] = shape[i]);
    x->data = malloc(n * (size_t)(bits / 8) + 64);
    for (size_t i = 0; i < n; i++) {
        double v = nms_boxes ? (i % 4 < 2 ? urand() * 1000 : 10 + urand() * 100) : urand() - 0.5;
        if (nms_boxes && i % 4 >= 2) /* x2 = x1 + w, y2 = y1 + h */
            v += bits == 64 ? ((double *)x->data)[i - 2] : ((float *)x->data)[i - 2];
        if (bits == 64)
            ((double *)x->data)[i] = v;
        else
            ((float *)x->data)[i] = (float)v;
    }
    x->t = (DLTensor){x->data, {kDLCPU, 0}, ndim, {kDLFloat, (uint8_t)bits, 1}, x->shape,
                      NULL, 0};
}

#define NCASES 48
typedef struct op_case {
    const char *op, *what;
    tensor in[3];
    tensor *grad; /* conv2d_backward's incoming gradient */
    int nin;
    int64_t stride, pad, groups;
    double iou;
} op_case;

static op_case cases[NCASES];
static int ncases;

/* The next free case: the table must hold every case make_cases adds. */
static op_case *new_case(void)
{
    if (ncases == NCASES) {
        fprintf(stderr, "test_pool: more than NCASES (%d) cases: raise it\n", NCASES);
        abort();
    }
    return &cases[ncases++];
}

static op_case *conv_case(const char *what, int bits, int64_t n, int64_t c, int64_t hw,
                          int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t groups,
                          int bias)
{
    op_case *q = new_case();
    q->op = "conv2d";
    q->what = what;
    int64_t xs[4] = {n, c, hw, hw}, ws[4] = {o, c / groups, k, k}, bs[1] = {o};
    tensor_init(&q->in[0], bits, 4, xs, 0);
    tensor_init(&q->in[1], bits, 4, ws, 0);
    if (bias)
        tensor_init(&q->in[2], bits, 1, bs, 0);
    q->nin = bias ? 3 : 2;
    q->stride = stride;
    q->pad = pad;
    q->groups = groups;
    return q;
}

static void make_cases(void)
{
    conv_case("conv 3x3 64->64 @28 batch 2 (Winograd)", 32, 2, 64, 28, 64, 3, 1, 1, 1, 1);
    conv_case("conv 3x3 32->40 @30 batch 1 (Winograd, partial blocks)", 32, 1, 32, 30, 40, 3,
              1, 1, 1, 0);
    conv_case("conv 1x1 96->48 @40 batch 3 (direct)", 32, 3, 96, 40, 48, 1, 1, 0, 1, 1);
    conv_case("conv 3x3 stride 2 groups 2 @33 batch 2 (im2col)", 32, 2, 32, 33, 64, 3, 2, 1,
              2, 1);
    conv_case("conv 3x3 float64 @24 batch 2", 64, 2, 16, 24, 24, 3, 1, 1, 1, 1);
    /* 1x1 direct: blocks of whole 48-column panels, the plane's partial
     * one in the last (57 x 57: 67 panels and 33 columns), the next panel
     * fetched in slices, blocks of rows over every panel (K 24), row tails */
    conv_case("conv 1x1 300->20 @57 batch 1 (direct)", 32, 1, 300, 57, 20, 1, 1, 0, 1, 1);
    conv_case("conv 1x1 24->70 @13 batch 2 (direct, K 24)", 32, 2, 24, 13, 70, 1, 1, 0, 1, 0);
    /* the gradients: grad_input, grad_weight (in slices), grad_bias */
    static const struct {
        const char *what;
        int bits;
        int64_t n, c, hw, o, k, stride, pad, groups;
    } bw[] = {
        {"conv2d_backward 3x3 32->48 @28 batch 2 (transposed Winograd, slices)", 32, 2, 32, 28,
         48, 3, 1, 1, 1},
        {"conv2d_backward 3x3 stride 2 @29 batch 2 (col2im)", 32, 2, 16, 29, 24, 3, 2, 1, 1},
        {"conv2d_backward 1x1 96->600 @9 (row and column blocks)", 32, 3, 96, 9, 600, 1, 1, 0, 1},
        {"conv2d_backward 5x5 groups 2 float64 @17", 64, 2, 8, 17, 12, 5, 1, 2, 2},
        {"conv2d_backward 1x1 65->24 @127 batch 2 (grad_input streamed out)", 32, 2, 65, 127,
         24, 1, 1, 0, 1},
        {"conv2d_backward 1x1 200->24 @7 (grad_input in row blocks)", 32, 1, 200, 7, 24, 1, 1,
         0, 1},
        {"conv2d_backward 3x3 16->160 @12 (grad_weight of transposed blocks)", 32, 2, 16, 12,
         160, 3, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof bw / sizeof *bw; i++) {
        op_case *q = conv_case(bw[i].what, bw[i].bits, bw[i].n, bw[i].c, bw[i].hw, bw[i].o,
                               bw[i].k, bw[i].stride, bw[i].pad, bw[i].groups, 1);
        int64_t ho = (bw[i].hw + 2 * bw[i].pad - bw[i].k) / bw[i].stride + 1;
        int64_t gs[4] = {bw[i].n, bw[i].o, ho, ho};
        q->op = "conv2d_backward";
        q->grad = malloc(sizeof(tensor));
        tensor_init(q->grad, bw[i].bits, 4, gs, 0);
    }
    const int64_t mms[][3] = {{300, 200, 500}, {1000, 64, 96}, {97, 300, 1029}};
    for (int i = 0; i < 3; i++) {
        op_case *q = new_case();
        q->op = "mm";
        q->what = i == 0 ? "mm 300x200x500" : i == 1 ? "mm 1000x64x96" : "mm 97x300x1029";
        int64_t a[2] = {mms[i][0], mms[i][1]}, b[2] = {mms[i][1], mms[i][2]};
        tensor_init(&q->in[0], 32, 2, a, 0);
        tensor_init(&q->in[1], 32, 2, b, 0);
        q->nin = 2;
    }
    { /* a transposed view of each operand */
        op_case *q = new_case();
        q->op = "mm";
        q->what = "mm transposed views 400x300x250";
        int64_t a[2] = {300, 400}, b[2] = {250, 300};
        tensor_init(&q->in[0], 32, 2, a, 0);
        tensor_init(&q->in[1], 32, 2, b, 0);
        for (int k = 0; k < 2; k++) { /* view [c, r] of the [r, c] data */
            tensor *t = &q->in[k];
            int64_t r = t->shape[0], c = t->shape[1];
            t->shape[0] = c;
            t->shape[1] = r;
            t->strides[0] = 1;
            t->strides[1] = c;
            t->t.strides = t->strides;
        }
        q->nin = 2;
    }
    { /* the gradients of mm [300, 200] x [200, 500] */
        op_case *q = new_case();
        q->op = "mm_backward";
        q->what = "mm_backward 300x200x500";
        int64_t g[2] = {300, 500}, a[2] = {300, 200}, b[2] = {200, 500};
        tensor_init(&q->in[0], 32, 2, g, 0);
        tensor_init(&q->in[1], 32, 2, a, 0);
        tensor_init(&q->in[2], 32, 2, b, 0);
        q->nin = 3;
    }
    { /* self^T [301, 97] read through a transposing copy (columns 1204
       * bytes apart), odd tails, both products in one parallel region */
        op_case *q = new_case();
        q->op = "mm_backward";
        q->what = "mm_backward 97x301x263";
        int64_t g[2] = {97, 263}, a[2] = {97, 301}, b[2] = {301, 263};
        tensor_init(&q->in[0], 32, 2, g, 0);
        tensor_init(&q->in[1], 32, 2, a, 0);
        tensor_init(&q->in[2], 32, 2, b, 0);
        q->nin = 3;
    }
    { /* a transposed self read in place (columns 520 bytes apart) */
        op_case *q = new_case();
        q->op = "mm";
        q->what = "mm transposed self 130x200x70";
        int64_t a[2] = {200, 130}, b[2] = {200, 70};
        tensor_init(&q->in[0], 32, 2, a, 0);
        tensor_init(&q->in[1], 32, 2, b, 0);
        tensor *t = &q->in[0];
        t->shape[0] = 130;
        t->shape[1] = 200;
        t->strides[0] = 1;
        t->strides[1] = 130;
        t->t.strides = t->strides;
        q->nin = 2;
    }
    {
        op_case *q = new_case();
        q->op = "mm_backward";
        q->what = "mm_backward float64 129x257x65";
        int64_t g[2] = {129, 65}, a[2] = {129, 257}, b[2] = {257, 65};
        tensor_init(&q->in[0], 64, 2, g, 0);
        tensor_init(&q->in[1], 64, 2, a, 0);
        tensor_init(&q->in[2], 64, 2, b, 0);
        q->nin = 3;
    }
    {
        op_case *q = new_case();
        q->op = "mm";
        q->what = "mm float64 257x300x129";
        int64_t a[2] = {257, 300}, b[2] = {300, 129};
        tensor_init(&q->in[0], 64, 2, a, 0);
        tensor_init(&q->in[1], 64, 2, b, 0);
        q->nin = 2;
    }
    for (int bits = 32; bits <= 64; bits += 32) {
        op_case *q = new_case();
        q->op = "nms";
        q->what = bits == 32 ? "nms 30000 boxes" : "nms 5000 boxes float64";
        int64_t n = bits == 32 ? 30000 : 5000, bs[2] = {n, 4}, ss[1] = {n};
        tensor_init(&q->in[0], bits, 2, bs, 1);
        tensor_init(&q->in[1], bits, 1, ss, 0);
        q->nin = 2;
        q->iou = 0.5;
    }
}

/* Run case q on rt: its output's bytes (malloc'd, *len set), or NULL. */
static void *run_case(opjit_runtime *rt, const op_case *q, size_t *len)
{
    opjit_op *op = NULL;
    if (opjit_find_op(rt, q->op, &op))
        return NULL;
    opjit_value a[9];
    int na;
    int64_t st[2] = {q->stride, q->stride}, pd[2] = {q->pad, q->pad}, dl[2] = {1, 1};
    if (!strcmp(q->op, "conv2d")) {
        a[0] = opjit_tensor((DLTensor *)&q->in[0].t);
        a[1] = opjit_tensor((DLTensor *)&q->in[1].t);
        a[2] = q->nin == 3 ? opjit_tensor((DLTensor *)&q->in[2].t) : opjit_none();
        a[3] = opjit_ints(st, 2);
        a[4] = opjit_ints(pd, 2);
        a[5] = opjit_ints(dl, 2);
        a[6] = opjit_int(q->groups);
        na = 7;
    } else if (!strcmp(q->op, "conv2d_backward")) {
        a[0] = opjit_tensor((DLTensor *)&q->grad->t);
        for (int k = 0; k < 3; k++)
            a[k + 1] = opjit_tensor((DLTensor *)&q->in[k].t);
        a[4] = opjit_ints(st, 2);
        a[5] = opjit_ints(pd, 2);
        a[6] = opjit_ints(dl, 2);
        a[7] = opjit_int(q->groups);
        na = 8;
    } else if (!strcmp(q->op, "mm")) {
        a[0] = opjit_tensor((DLTensor *)&q->in[0].t);
        a[1] = opjit_tensor((DLTensor *)&q->in[1].t);
        na = 2;
    } else if (!strcmp(q->op, "mm_backward")) {
        for (int k = 0; k < 3; k++)
            a[k] = opjit_tensor((DLTensor *)&q->in[k].t);
        na = 3;
    } else {
        a[0] = opjit_tensor((DLTensor *)&q->in[0].t);
        a[1] = opjit_tensor((DLTensor *)&q->in[1].t);
        a[2] = opjit_float(q->iou);
        na = 3;
    }
    DLManagedTensor *outs[3] = {NULL, NULL, NULL};
    if (opjit_call(rt, op, a, na, outs, 3)) {
        fprintf(stderr, "%s: %s\n", q->what, opjit_errmsg(rt));
        return NULL;
    }
    /* every output's bytes, one after the other */
    size_t n = 0, at = 0;
    for (int o = 0; o < 3 && outs[o]; o++) {
        size_t b = outs[o]->dl_tensor.dtype.bits / 8;
        for (int i = 0; i < outs[o]->dl_tensor.ndim; i++)
            b *= (size_t)outs[o]->dl_tensor.shape[i];
        n += b;
    }
    char *copy = malloc(n ? n : 1);
    for (int o = 0; o < 3 && outs[o]; o++) {
        size_t b = outs[o]->dl_tensor.dtype.bits / 8;
        for (int i = 0; i < outs[o]->dl_tensor.ndim; i++)
            b *= (size_t)outs[o]->dl_tensor.shape[i];
        memcpy(copy + at, outs[o]->dl_tensor.data, b);
        at += b;
        outs[o]->deleter(outs[o]);
    }
    *len = n;
    return copy;
}

static void test_ops_same_bits(void)
{
    static const int counts[3] = {1, 2, 7};
    /* libtcc's code, the optimizing tier's, and the latter built for AVX2
     * (OPJIT_CPU_LEVEL), whose GEMM splits the work its own way, on a CPU
     * that has more */
    static const char *const level[3] = {NULL, NULL, "avx2"};
    make_cases();
    for (int pass = 0; pass < 3; pass++) {
        int tiering = pass > 0;
        void *ref[NCASES] = {0};
        size_t reflen[NCASES] = {0};
        if (level[pass])
            setenv("OPJIT_CPU_LEVEL", level[pass], 1);
        else
            unsetenv("OPJIT_CPU_LEVEL");
        for (int c = 0; c < 3; c++) {
            opjit_runtime *rt = new_rt(counts[c], tiering, NULL, NULL);
            load(rt, "conv2d");
            load(rt, "mm");
            load(rt, "nms");
            if (tiering)
                CHECKF(opjit_wait(rt) == OPJIT_OK, "opjit_wait: %s", opjit_errmsg(rt));
            for (int i = 0; i < ncases; i++) {
                size_t len = 0;
                void *got = run_case(rt, &cases[i], &len);
                CHECKF(got != NULL, "%s failed", cases[i].what);
                if (!got)
                    continue;
                if (c == 0) {
                    ref[i] = got;
                    reflen[i] = len;
                    continue;
                }
                CHECKF(ref[i] && len == reflen[i] && !memcmp(got, ref[i], len),
                       "%s, %s tier%s%s: %d threads give other bits than 1", cases[i].what,
                       tiering ? "opt" : "tcc", level[pass] ? " at " : "",
                       level[pass] ? level[pass] : "", counts[c]);
                free(got);
            }
            opjit_destroy(rt);
        }
        for (int i = 0; i < ncases; i++)
            free(ref[i]);
    }
    unsetenv("OPJIT_CPU_LEVEL");
    for (int i = 0; i < ncases; i++) {
        for (int k = 0; k < cases[i].nin; k++)
            free(cases[i].in[k].data);
        if (cases[i].grad) {
            free(cases[i].grad->data);
            free(cases[i].grad);
        }
    }
}

int main(void)
{
    for (int i = 0; i < PN; i++)
        px[i] = (float)i * 0.25f - 100;
    dir = t_tmpdir("pool");
    probe_path = strdup(t_path(dir, "par_probe.c"));
    t_write(probe_path, probe_source, strlen(probe_source));
    T_RUN(test_blas_threads); /* first: nothing has loaded OpenBLAS yet */
    T_RUN(test_lazy_start);
    T_RUN(test_thread_count);
    T_RUN(test_both_tiers);
    T_RUN(test_chunk_failures);
    T_RUN(test_host_pool);
    T_RUN(test_many_host_threads);
    T_RUN(test_ops_same_bits);
    free((void *)probe_path);
    t_tmpdirs_remove();
    return t_done();
}
