/* tests/test_threads.c - one runtime, many threads: concurrent calls with
 * per-thread inputs, per-thread error messages, reloads while calls are in
 * flight, concurrent loads (one runtime and several).
 *
 * No timing assertions: threads meet at barriers or run until another
 * thread says stop, so the test is the same on a busy 2-core machine. */
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"

#define NTHREADS 8

/* CHECK is not thread-safe (it bumps a plain counter); threads count their
 * own failures and report them on the main thread. */
static atomic_int thread_failures;
#define TCHECK(cond, ...)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            if (atomic_fetch_add(&thread_failures, 1) < 20) {                \
                fprintf(stderr, "%s:%d: thread check failed: %s: ",          \
                        __FILE__, __LINE__, #cond);                          \
                fprintf(stderr, __VA_ARGS__);                                \
                fputc('\n', stderr);                                         \
            }                                                                \
        }                                                                    \
    } while (0)

static void thread_checks_passed(void)
{
    int n = atomic_exchange(&thread_failures, 0);
    CHECKF(n == 0, "%d checks failed in threads", n);
}

/* ---- files ---------------------------------------------------------------------------- */

static char tmp_dir[512];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(p);
    return 0;
}

static const char *pjoin(const char *name)
{
    static _Thread_local char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", tmp_dir, name);
    return buf;
}

static int write_file(const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n;
    return fclose(f) || bad ? -1 : 0;
}

/* An op `name() -> Tensor` returning value (+ QAT_COMMON from a local
 * header) as a 1-element int64. */
static int write_const_op(const char *file, const char *name, long value)
{
    char src[2048];
    snprintf(src, sizeof src,
             "#include <opjit_op.h>\n"
             "#include \"qat_common.h\"\n"
             "static int k(opjit_ctx *ctx, opjit_args *a)\n"
             "{\n"
             "    (void)a;\n"
             "    int64_t shape[1] = {1};\n"
             "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
             "    if (!t)\n"
             "        return -1;\n"
             "    ((int64_t *)t->data)[0] = %ld + QAT_COMMON;\n"
             "    return 0;\n"
             "}\n"
             "OPJIT_MODULE(%s, m)\n"
             "{\n"
             "    opjit_def(m, \"%s() -> Tensor\", OPJIT_CPU, k, \"value %ld\");\n"
             "}\n",
             value, name, name, value);
    return write_file(file, src);
}

#define CALL_FAILED (-999999)

static long call_value(opjit_runtime *rt, const opjit_op *op)
{
    DLManagedTensor *out = NULL;
    if (opjit_call(rt, op, NULL, 0, &out, 1))
        return CALL_FAILED;
    long v = (long)((int64_t *)out->dl_tensor.data)[0];
    out->deleter(out);
    return v;
}

static const char ops_source[] =
    "#include <opjit_op.h>\n"
    "#include <string.h>\n"
    "/* x * scale + bias, through a workspace copy of x */\n"
    "static int affine(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    double scale = opjit_arg_float(a, 1);\n"
    "    int64_t bias = opjit_arg_int(a, 2), n = opjit_numel(x);\n"
    "    float *w = opjit_workspace(ctx, (size_t)n * sizeof(float));\n"
    "    float *w2 = opjit_workspace(ctx, 256);\n"
    "    if (!w || !w2)\n"
    "        return -1;\n"
    "    memcpy(w, opjit_data(x), (size_t)n * sizeof(float));\n"
    "    memset(w2, 0, 256);\n"
    "    DLTensor *o = opjit_output(ctx, 0, OPJIT_FLOAT32, 1, x->shape);\n"
    "    if (!o)\n"
    "        return -1;\n"
    "    for (int64_t i = 0; i < n; i++)\n"
    "        ((float *)o->data)[i] = (float)(w[i] * scale + (double)bias);\n"
    "    return 0;\n"
    "}\n"
    "static int failing(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    return opjit_fail(ctx, \"code %lld\", (long long)opjit_arg_int(a, 0));\n"
    "}\n"
    "OPJIT_MODULE(qat_ops, m)\n"
    "{\n"
    "    opjit_def(m, \"qat_affine(Tensor x, float scale, int bias=0) -> Tensor\", OPJIT_CPU,\n"
    "              affine, \"\");\n"
    "    opjit_require(m, \"x\", \"float32 rank=1 contiguous\");\n"
    "    opjit_def(m, \"qat_fail(int code) -> Tensor\", OPJIT_CPU, failing, \"\");\n"
    "}\n";

static opjit_runtime *rt;
static opjit_op *op_affine, *op_fail;

/* ---- many threads, one op ------------------------------------------------------------- */

#define ITERS 400

static void *caller(void *arg)
{
    int tid = (int)(intptr_t)arg;
    int n = 16 + tid * 5;
    float *xs = malloc((size_t)n * sizeof(float));
    int64_t shape[1] = {n};
    DLTensor x = {xs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
    for (int it = 0; it < ITERS; it++) {
        for (int i = 0; i < n; i++)
            xs[i] = (float)(tid * 1000 + it + i);
        double scale = 1 + tid;
        int64_t bias = it;
        opjit_value args[3] = {opjit_tensor(&x), opjit_float(scale), opjit_int(bias)};
        DLManagedTensor *out = NULL;
        int rc = opjit_call(rt, op_affine, args, 3, &out, 1);
        TCHECK(rc == OPJIT_OK, "thread %d iter %d: %s", tid, it, opjit_errmsg(rt));
        if (rc)
            continue;
        TCHECK(out->dl_tensor.shape[0] == n, "thread %d: shape %lld", tid,
               (long long)out->dl_tensor.shape[0]);
        const float *y = out->dl_tensor.data;
        for (int i = 0; i < n; i++) {
            float want = (float)(xs[i] * scale + (double)bias);
            if (y[i] != want) {
                TCHECK(y[i] == want, "thread %d iter %d [%d]: %g != %g", tid, it, i, y[i], want);
                break;
            }
        }
        out->deleter(out);
    }
    free(xs);
    return NULL;
}

static void concurrent_calls_of_one_op(void)
{
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, caller, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    thread_checks_passed();
}

/* ---- errors are per thread ------------------------------------------------------------- */

static pthread_barrier_t pair_barrier;

/* Thread A makes a dtype error, thread B a missing-argument error; each
 * then finds its own message, whatever the other did in between. */
static void *error_a(void *arg)
{
    (void)arg;
    double xd[2] = {1, 2};
    int64_t shape[1] = {2};
    DLTensor x = {xd, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, shape, NULL, 0};
    for (int round = 0; round < 50; round++) {
        opjit_value args[2] = {opjit_tensor(&x), opjit_float(1)};
        DLManagedTensor *out = NULL;
        int rc = opjit_call(rt, op_affine, args, 2, &out, 1);
        TCHECK(rc == OPJIT_ECALL, "A: %d", rc);
        pthread_barrier_wait(&pair_barrier); /* A has its error */
        pthread_barrier_wait(&pair_barrier); /* B has its error */
        const char *msg = opjit_errmsg(rt);
        TCHECK(strstr(msg, "float64") && !strstr(msg, "missing"), "A sees '%s'", msg);
        pthread_barrier_wait(&pair_barrier); /* B succeeded */
        msg = opjit_errmsg(rt);
        TCHECK(strstr(msg, "float64") != NULL, "A sees '%s' after B's success", msg);
    }
    return NULL;
}

static void *error_b(void *arg)
{
    (void)arg;
    float xs[2] = {1, 2};
    int64_t shape[1] = {2};
    DLTensor x = {xs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
    for (int round = 0; round < 50; round++) {
        pthread_barrier_wait(&pair_barrier);
        opjit_value args[2] = {opjit_tensor(&x), opjit_float(1)};
        DLManagedTensor *out = NULL;
        int rc = opjit_call(rt, op_affine, args, 1, &out, 1);
        TCHECK(rc == OPJIT_ECALL, "B: %d", rc);
        const char *msg = opjit_errmsg(rt);
        TCHECK(strstr(msg, "missing") && strstr(msg, "'scale'"), "B sees '%s'", msg);
        pthread_barrier_wait(&pair_barrier);
        rc = opjit_call(rt, op_affine, args, 2, &out, 1);
        TCHECK(rc == OPJIT_OK, "B: %s", opjit_errmsg(rt));
        if (rc == OPJIT_OK)
            out->deleter(out);
        pthread_barrier_wait(&pair_barrier);
    }
    return NULL;
}

/* Every thread fails with its own code and reads its own message back. */
static void *error_storm(void *arg)
{
    int tid = (int)(intptr_t)arg;
    for (int it = 0; it < 300; it++) {
        long long code = (long long)tid * 100000 + it;
        opjit_value a[1] = {opjit_int(code)};
        DLManagedTensor *out = NULL;
        int rc = opjit_call(rt, op_fail, a, 1, &out, 1);
        TCHECK(rc == OPJIT_EKERNEL && out == NULL, "thread %d: %d", tid, rc);
        char want[64];
        snprintf(want, sizeof want, "qat_fail: code %lld", code);
        const char *msg = opjit_errmsg(rt);
        TCHECK(!strcmp(msg, want), "thread %d reads '%s', wants '%s'", tid, msg, want);
    }
    return NULL;
}

static void errors_are_per_thread(void)
{
    pthread_barrier_init(&pair_barrier, NULL, 2);
    pthread_t a, b;
    CHECK(pthread_create(&a, NULL, error_a, NULL) == 0);
    CHECK(pthread_create(&b, NULL, error_b, NULL) == 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    pthread_barrier_destroy(&pair_barrier);

    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, error_storm, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    thread_checks_passed();

    /* The main thread's message is its own too. */
    opjit_value a0[1] = {opjit_int(-5)};
    DLManagedTensor *out = NULL;
    CHECK(opjit_call(rt, op_fail, a0, 1, &out, 1) == OPJIT_EKERNEL);
    CHECK(!strcmp(opjit_errmsg(rt), "qat_fail: code -5"));

    /* Messages are per runtime as well. */
    opjit_runtime *other = NULL;
    CHECK(opjit_create(NULL, &other) == OPJIT_OK);
    opjit_op *none = NULL;
    CHECK(opjit_find_op(other, "qat_affine", &none) == OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(other), "qat_affine");
    CHECK(strstr(opjit_errmsg(rt), "code -5") || opjit_errmsg(rt)[0] == '\0');
    opjit_destroy(other);
}

/* ---- reload while calling ------------------------------------------------------------ */

#define RELOADS 12
static atomic_int reload_done;
static opjit_op *op_gen;

static void *gen_caller(void *arg)
{
    int tid = (int)(intptr_t)arg;
    long last = 0;
    long calls = 0;
    while (!atomic_load(&reload_done) || calls < 10) {
        long v = call_value(rt, op_gen);
        calls++;
        TCHECK(v >= 0 && v <= RELOADS, "thread %d got %ld: %s", tid, v,
               v == CALL_FAILED ? opjit_errmsg(rt) : "");
        /* One writer, atomic publication: a thread never goes back. */
        TCHECK(v == CALL_FAILED || v >= last, "thread %d went back from %ld to %ld", tid, last, v);
        if (v != CALL_FAILED)
            last = v;
    }
    return NULL;
}

static void *reloader(void *arg)
{
    (void)arg;
    for (int g = 1; g <= RELOADS; g++) {
        TCHECK(write_const_op("qat_gen.c", "qat_gen", g) == 0, "write");
        opjit_op *op = NULL;
        int rc = opjit_load_op(rt, pjoin("qat_gen.c"), &op);
        TCHECK(rc == OPJIT_OK && op == op_gen, "reload %d: %s", g, opjit_errmsg(rt));
    }
    atomic_store(&reload_done, 1);
    return NULL;
}

static void reload_while_calling(void)
{
    CHECK(write_const_op("qat_gen.c", "qat_gen", 0) == 0);
    int rc = opjit_load_op(rt, pjoin("qat_gen.c"), &op_gen);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (rc)
        return;
    CHECK(call_value(rt, op_gen) == 0);
    atomic_store(&reload_done, 0);
    pthread_t callers[NTHREADS - 1], w;
    for (int i = 0; i < NTHREADS - 1; i++)
        CHECK(pthread_create(&callers[i], NULL, gen_caller, (void *)(intptr_t)i) == 0);
    CHECK(pthread_create(&w, NULL, reloader, NULL) == 0);
    pthread_join(w, NULL);
    for (int i = 0; i < NTHREADS - 1; i++)
        pthread_join(callers[i], NULL);
    thread_checks_passed();
    CHECK(call_value(rt, op_gen) == RELOADS);
}

/* ---- concurrent loads ------------------------------------------------------------------ */

static pthread_barrier_t load_barrier;

typedef struct load_job {
    opjit_runtime *rt; /* NULL: a runtime of its own */
    int id;
    const char *file; /* NULL: its own file */
    opjit_op *op;
    long value;
} load_job;

static void *loader_thread(void *arg)
{
    load_job *j = arg;
    char file[80], name[64];
    snprintf(name, sizeof name, "qat_load_%d", j->id);
    snprintf(file, sizeof file, "%s.c", name);
    if (!j->file)
        TCHECK(write_const_op(file, name, 500 + j->id) == 0, "write %s", file);
    opjit_runtime *r = j->rt;
    if (!r)
        TCHECK(opjit_create(NULL, &r) == OPJIT_OK, "create");
    pthread_barrier_wait(&load_barrier);
    if (!r)
        return NULL;
    int rc = opjit_load_op(r, pjoin(j->file ? j->file : file), &j->op);
    TCHECK(rc == OPJIT_OK, "thread %d: %s", j->id, opjit_errmsg(r));
    j->value = rc ? CALL_FAILED : call_value(r, j->op);
    /* Look-ups while others load. */
    opjit_op *found = NULL;
    if (!j->file)
        TCHECK(opjit_find_op(r, name, &found) == OPJIT_OK && found == j->op, "find %s", name);
    if (!j->rt)
        opjit_destroy(r);
    return NULL;
}

static void run_loaders(load_job *jobs, int n)
{
    pthread_t th[NTHREADS];
    pthread_barrier_init(&load_barrier, NULL, (unsigned)n);
    for (int i = 0; i < n; i++)
        CHECK(pthread_create(&th[i], NULL, loader_thread, &jobs[i]) == 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&load_barrier);
}

static int count_ops(void *ud, const opjit_op *op)
{
    (void)op;
    (*(int *)ud)++;
    return 0;
}

static void concurrent_loads(void)
{
    /* Different ops into one runtime. */
    load_job jobs[NTHREADS];
    int before = 0, after = 0;
    opjit_list(rt, count_ops, &before);
    for (int i = 0; i < 4; i++)
        jobs[i] = (load_job){.rt = rt, .id = i};
    run_loaders(jobs, 4);
    for (int i = 0; i < 4; i++)
        CHECKF(jobs[i].value == 500 + i, "job %d: %ld", i, jobs[i].value);
    opjit_list(rt, count_ops, &after);
    CHECK(after == before + 4);

    /* The same new op from several threads: one op, loaded once. */
    CHECK(write_const_op("qat_same.c", "qat_same", 77) == 0);
    for (int i = 0; i < 4; i++)
        jobs[i] = (load_job){.rt = rt, .id = 10 + i, .file = "qat_same.c"};
    run_loaders(jobs, 4);
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i].value == 77);
        CHECK(jobs[i].op != NULL && jobs[i].op == jobs[0].op);
    }

    /* Separate runtimes loading at once (one compiler, one cache). */
    for (int i = 0; i < 4; i++)
        jobs[i] = (load_job){.rt = NULL, .id = 20 + i};
    run_loaders(jobs, 4);
    for (int i = 0; i < 4; i++)
        CHECKF(jobs[i].value == 520 + i, "job %d: %ld", 20 + i, jobs[i].value);
    /* ... and the same source in separate runtimes. */
    for (int i = 0; i < 4; i++)
        jobs[i] = (load_job){.rt = NULL, .id = 30 + i, .file = "qat_same.c"};
    run_loaders(jobs, 4);
    for (int i = 0; i < 4; i++)
        CHECK(jobs[i].value == 77);
    thread_checks_passed();
}

/* Calls keep going while another thread loads new ops. */
static atomic_int loading_done;

static void *busy_caller(void *arg)
{
    (void)arg;
    float xs[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    DLTensor x = {xs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
    long calls = 0;
    while (!atomic_load(&loading_done) || calls < 10) {
        opjit_value args[2] = {opjit_tensor(&x), opjit_int(2)};
        DLManagedTensor *out = NULL;
        int rc = opjit_call(rt, op_affine, args, 2, &out, 1);
        TCHECK(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
        if (rc == OPJIT_OK) {
            TCHECK(((float *)out->dl_tensor.data)[3] == 8, "wrong result");
            out->deleter(out);
        }
        int n = 0;
        opjit_list(rt, count_ops, &n);
        TCHECK(n > 0, "no ops listed");
        calls++;
    }
    return NULL;
}

static void calls_during_loads(void)
{
    atomic_store(&loading_done, 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&th[i], NULL, busy_caller, NULL) == 0);
    for (int i = 0; i < 6; i++) {
        char file[80], name[64];
        snprintf(name, sizeof name, "qat_more_%d", i);
        snprintf(file, sizeof file, "%s.c", name);
        CHECK(write_const_op(file, name, i) == 0);
        opjit_op *op = NULL;
        CHECK(opjit_load_op(rt, pjoin(file), &op) == OPJIT_OK);
        CHECK(call_value(rt, op) == i);
    }
    atomic_store(&loading_done, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    thread_checks_passed();
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/opjit-test-threads-XXXXXX",
             base && *base ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    if (!getenv("OPJIT_CACHE_DIR")) {
        char c[600];
        snprintf(c, sizeof c, "%s/cache", tmp_dir);
        setenv("OPJIT_CACHE_DIR", c, 1);
    }
    if (write_file("qat_common.h", "#define QAT_COMMON 0\n") ||
        write_file("qat_ops.c", ops_source) || opjit_create(NULL, &rt)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    int rc = opjit_load_op(rt, pjoin("qat_ops.c"), NULL);
    if (rc || opjit_find_op(rt, "qat_affine", &op_affine) || opjit_find_op(rt, "qat_fail", &op_fail)) {
        fprintf(stderr, "loading the test ops: %s\n", opjit_errmsg(rt));
        return 1;
    }
    T_RUN(concurrent_calls_of_one_op);
    T_RUN(errors_are_per_thread);
    T_RUN(reload_while_calling);
    T_RUN(concurrent_loads);
    T_RUN(calls_during_loads);
    opjit_destroy(rt);
    nftw(tmp_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return t_done();
}
