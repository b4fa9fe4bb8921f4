/* tests/test_alloc.c - the host allocator (config.alloc): outputs and
 * workspaces come from it, every block goes back with the size it was
 * allocated with, nothing is left when outputs are freed and the runtime is
 * destroyed; and allocation failures injected one at a time, Lua-style,
 * make calls fail cleanly without leaks, after which calls work again. */
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"

/* ---- a counting allocator with fault injection -------------------------------------- */

#define MAX_BLOCKS 4096

typedef struct counter {
    pthread_mutex_t mu;
    long live_blocks;
    size_t live_bytes;
    long allocs;          /* allocation requests (nsize > 0), failed ones included */
    long fail_at;         /* fail the fail_at-th request after arming; 0: never */
    long failed;          /* requests failed on purpose */
    int fail_all;         /* fail every request */
    size_t max_request;
    int bad_osize;        /* a free or realloc with the wrong old size */
    int unknown_ptr;      /* a pointer we never handed out */
    int bad_ud;
    struct {
        void *p;
        size_t n;
    } blocks[MAX_BLOCKS];
} counter;

static counter the_counter = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int block_find(counter *c, void *p)
{
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (c->blocks[i].p == p)
            return i;
    return -1;
}

static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    counter *c = &the_counter;
    pthread_mutex_lock(&c->mu);
    if (ud != c)
        c->bad_ud++;
    int i = -1;
    if (ptr) {
        i = block_find(c, ptr);
        if (i < 0)
            c->unknown_ptr++;
        else if (c->blocks[i].n != osize)
            c->bad_osize++;
    }
    void *res = NULL;
    if (nsize == 0) {
        if (i >= 0) {
            c->live_blocks--;
            c->live_bytes -= c->blocks[i].n;
            c->blocks[i].p = NULL;
        }
        free(ptr);
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    c->allocs++;
    if (nsize > c->max_request)
        c->max_request = nsize;
    if (c->fail_all || (c->fail_at && --c->fail_at == 0)) {
        c->failed++;
        pthread_mutex_unlock(&c->mu);
        return NULL; /* a failed realloc leaves ptr alone */
    }
    res = realloc(ptr, nsize);
    if (res) {
        if (i >= 0) {
            c->live_bytes -= c->blocks[i].n;
            c->live_blocks--;
            c->blocks[i].p = NULL;
        }
        int j = block_find(c, NULL);
        if (j >= 0) {
            c->blocks[j].p = res;
            c->blocks[j].n = nsize;
        }
        c->live_blocks++;
        c->live_bytes += nsize;
    }
    pthread_mutex_unlock(&c->mu);
    return res;
}

/* Is p inside a live block? */
static int is_live(const void *p)
{
    counter *c = &the_counter;
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < MAX_BLOCKS && !found; i++)
        found = c->blocks[i].p && (const char *)p >= (const char *)c->blocks[i].p &&
                (const char *)p < (const char *)c->blocks[i].p + c->blocks[i].n;
    pthread_mutex_unlock(&c->mu);
    return found;
}

static long live_blocks(void)
{
    pthread_mutex_lock(&the_counter.mu);
    long n = the_counter.live_blocks;
    pthread_mutex_unlock(&the_counter.mu);
    return n;
}

static long allocs(void)
{
    pthread_mutex_lock(&the_counter.mu);
    long n = the_counter.allocs;
    pthread_mutex_unlock(&the_counter.mu);
    return n;
}

static void arm(long k)
{
    pthread_mutex_lock(&the_counter.mu);
    the_counter.fail_at = k;
    pthread_mutex_unlock(&the_counter.mu);
}

static void check_counter_sane(void)
{
    counter *c = &the_counter;
    CHECKF(c->bad_osize == 0, "%d frees with the wrong old size", c->bad_osize);
    CHECKF(c->unknown_ptr == 0, "%d frees of pointers not from the allocator", c->unknown_ptr);
    CHECKF(c->bad_ud == 0, "the allocator got another user pointer %d times", c->bad_ud);
}

/* ---- the op --------------------------------------------------------------------------- */

static const char op_source[] =
    "#include <opjit_op.h>\n"
    "#include <string.h>\n"
    "/* (x + 1, sum(x)), using a workspace of ws bytes and another of 64 */\n"
    "static int k(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int64_t ws = opjit_arg_int(a, 1), n = opjit_numel(x);\n"
    "    float *w1 = NULL, *w2 = NULL;\n"
    "    if (ws > 0) {\n"
    "        w1 = opjit_workspace(ctx, (size_t)ws);\n"
    "        if (!w1)\n"
    "            return -1;\n"
    "        memset(w1, 0x5a, (size_t)ws);\n"
    "        w2 = opjit_workspace(ctx, 64);\n"
    "        if (!w2)\n"
    "            return -1;\n"
    "        memset(w2, 0x33, 64);\n"
    "    }\n"
    "    DLTensor *o0 = opjit_output(ctx, 0, OPJIT_FLOAT32, x->ndim, x->shape);\n"
    "    if (!o0)\n"
    "        return -1;\n"
    "    DLTensor *o1 = opjit_output(ctx, 1, OPJIT_FLOAT64, 0, NULL);\n"
    "    if (!o1)\n"
    "        return -1;\n"
    "    const float *px = opjit_data(x);\n"
    "    double s = 0;\n"
    "    for (int64_t i = 0; i < n; i++) {\n"
    "        ((float *)o0->data)[i] = px[i] + 1;\n"
    "        s += px[i];\n"
    "    }\n"
    "    *(double *)o1->data = s;\n"
    "    if (w1 && ((unsigned char *)w1)[ws - 1] != 0x5a)\n"
    "        return opjit_fail(ctx, \"workspace overwritten\");\n"
    "    return 0;\n"
    "}\n"
    "OPJIT_MODULE(qaa_op, m)\n"
    "{\n"
    "    opjit_def(m, \"qaa_op(Tensor x, int ws=0) -> (Tensor, Tensor)\", OPJIT_CPU, k, \"\");\n"
    "    opjit_require(m, \"x\", \"float32 rank=1 contiguous\");\n"
    "}\n";

static char tmp_dir[512], src_path[1024];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(p);
    return 0;
}

static opjit_runtime *rt_with_counter(opjit_op **op)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.alloc = counting_alloc;
    cfg.alloc_ud = &the_counter;
    opjit_runtime *rt = NULL;
    int rc = opjit_create(&cfg, &rt);
    if (rc) {
        fprintf(stderr, "opjit_create: %s\n", opjit_status_name(rc));
        exit(1);
    }
    rc = opjit_load_op(rt, src_path, op);
    if (rc) {
        fprintf(stderr, "load: %s: %s\n", opjit_status_name(rc), opjit_errmsg(rt));
        exit(1);
    }
    return rt;
}

static float xs[6] = {1, 2, 3, 4, 5, 6};
static int64_t x_shape[1] = {6};
static DLTensor x_tensor = {xs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, x_shape, NULL, 0};

/* Run the op; on success check the results and keep the outputs in outs. */
static int run(opjit_runtime *rt, opjit_op *op, int64_t ws, DLManagedTensor *outs[2])
{
    opjit_value a[2] = {opjit_tensor(&x_tensor), opjit_int(ws)};
    outs[0] = outs[1] = NULL;
    int rc = opjit_call(rt, op, a, 2, outs, 2);
    if (rc == OPJIT_OK) {
        CHECK(outs[0] && outs[1]);
        if (outs[0] && outs[1]) {
            for (int i = 0; i < 6; i++)
                CHECK(((float *)outs[0]->dl_tensor.data)[i] == xs[i] + 1);
            CHECK(*(double *)outs[1]->dl_tensor.data == 21);
        }
    } else {
        CHECKF(outs[0] == NULL && outs[1] == NULL, "a failed call handed out outputs");
    }
    return rc;
}

static void free_outs(DLManagedTensor *outs[2])
{
    for (int i = 0; i < 2; i++)
        if (outs[i]) {
            outs[i]->deleter(outs[i]);
            outs[i] = NULL;
        }
}

/* ---- tests ---------------------------------------------------------------------------- */

static void outputs_and_workspaces_come_from_the_allocator(void)
{
    opjit_op *op = NULL;
    opjit_runtime *rt = rt_with_counter(&op);
    long base = live_blocks();
    DLManagedTensor *outs[2];

    /* Outputs: live blocks while they are alive. */
    CHECKF(run(rt, op, 0, outs) == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(live_blocks() >= base + 2);
    CHECK(is_live(outs[0]->dl_tensor.data));
    CHECK(is_live(outs[1]->dl_tensor.data));
    CHECK(is_live(outs[0]->dl_tensor.shape));
    CHECK((uintptr_t)outs[0]->dl_tensor.data % 16 == 0);
    DLManagedTensor *more[2];
    CHECK(run(rt, op, 0, more) == OPJIT_OK);
    CHECK(live_blocks() >= base + 4);
    free_outs(more);
    free_outs(outs);
    CHECK(live_blocks() == base);

    /* A workspace: a request of at least its size. */
    the_counter.max_request = 0;
    CHECK(run(rt, op, 1 << 20, outs) == OPJIT_OK);
    CHECKF(the_counter.max_request >= (1 << 20), "no workspace-sized request (max %zu)",
           the_counter.max_request);
    free_outs(outs);
    /* The same demand again is served from memory kept between calls:
     * only the two outputs are new. */
    long before = allocs();
    CHECK(run(rt, op, 1 << 20, outs) == OPJIT_OK);
    CHECKF(allocs() - before == 2, "%ld allocations for a call whose workspace fits",
           allocs() - before);
    free_outs(outs);

    /* An output outlives the runtime; its deleter still works. */
    CHECK(run(rt, op, 4096, outs) == OPJIT_OK);
    opjit_destroy(rt);
    CHECK(live_blocks() == 2);
    CHECK(((float *)outs[0]->dl_tensor.data)[5] == 7);
    free_outs(outs);
    CHECK(live_blocks() == 0);
    CHECK(the_counter.live_bytes == 0);
    check_counter_sane();
}

/* Fail the k-th allocation of one call, for every k, on a fresh runtime
 * (the workspace is allocated for the first time) and on a warm one. */
static void injected_failures(int warm)
{
    int saw_enomem = 0;
    long needed = -1;
    opjit_op *op = NULL;
    opjit_runtime *rt = warm ? rt_with_counter(&op) : NULL;
    DLManagedTensor *outs[2];
    if (warm) {
        CHECK(run(rt, op, 100000, outs) == OPJIT_OK);
        free_outs(outs);
    }
    /* How many allocations one call makes. */
    {
        opjit_runtime *r = warm ? rt : rt_with_counter(&op);
        long before = allocs();
        CHECK(run(r, op, 100000, outs) == OPJIT_OK);
        needed = allocs() - before;
        free_outs(outs);
        if (!warm)
            opjit_destroy(r);
    }
    CHECK(needed >= 2);
    for (long k = 1; k <= needed + 1; k++) {
        if (!warm)
            rt = rt_with_counter(&op);
        long failed_before = the_counter.failed;
        arm(k);
        int rc = run(rt, op, 100000, outs);
        arm(0);
        int injected = the_counter.failed != failed_before;
        CHECKF(rc == OPJIT_OK || rc == OPJIT_ENOMEM || rc == OPJIT_EKERNEL,
               "k=%ld: %s: %s", k, opjit_status_name(rc), opjit_errmsg(rt));
        if (k > needed)
            CHECKF(rc == OPJIT_OK && !injected, "k=%ld: nothing to fail, yet %s", k,
                   opjit_status_name(rc));
        if (rc != OPJIT_OK) {
            CHECK(injected);
            const char *msg = opjit_errmsg(rt);
            CHECKF(msg[0] != '\0', "k=%ld: no message", k);
            CHECK_STR_CONTAINS(msg, "qaa_op");
            if (rc == OPJIT_ENOMEM) {
                saw_enomem = 1;
                CHECK_STR_CONTAINS(msg, "memory");
            }
        }
        free_outs(outs);
        /* The next call succeeds. */
        rc = run(rt, op, 100000, outs);
        CHECKF(rc == OPJIT_OK, "k=%ld: the call after the failure: %s", k, opjit_errmsg(rt));
        free_outs(outs);
        if (!warm) {
            opjit_destroy(rt);
            CHECKF(live_blocks() == 0, "k=%ld: %ld blocks leaked", k, live_blocks());
        }
    }
    if (warm) {
        opjit_destroy(rt);
        CHECKF(live_blocks() == 0, "%ld blocks leaked", live_blocks());
    }
    CHECK(saw_enomem);
    CHECK(the_counter.live_bytes == 0);
    check_counter_sane();
}

static void injected_failures_cold(void) { injected_failures(0); }
static void injected_failures_warm(void) { injected_failures(1); }

/* Every allocation fails: calls fail cleanly, forever, and recover. */
static void an_allocator_that_always_fails(void)
{
    opjit_op *op = NULL;
    opjit_runtime *rt = rt_with_counter(&op);
    DLManagedTensor *outs[2];
    the_counter.fail_all = 1;
    for (int i = 0; i < 20; i++) {
        int rc = run(rt, op, i % 2 ? 5000 : 0, outs);
        CHECKF(rc == OPJIT_ENOMEM, "%s", opjit_status_name(rc));
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "memory");
    }
    the_counter.fail_all = 0;
    CHECK(run(rt, op, 5000, outs) == OPJIT_OK);
    free_outs(outs);
    opjit_destroy(rt);
    CHECK(live_blocks() == 0);
    check_counter_sane();
}

/* The default allocator keeps large freed blocks for reuse (when
 * OPJIT_OUTPUT_CACHE allows; it is off by default under ASan): a second
 * output of the same size gets the first one's memory, and an output freed
 * after opjit_destroy goes back to the system (ASan/LSan check that). */
static void default_allocator_reuses_large_outputs(void)
{
    static float big[100000];
    static int64_t big_shape[1] = {100000};
    DLTensor bt = {big, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, big_shape, NULL, 0};
    const char *old = getenv("OPJIT_OUTPUT_CACHE");
    char saved[64] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    setenv("OPJIT_OUTPUT_CACHE", "64M", 1);
    opjit_runtime *rt = NULL;
    opjit_op *op = NULL;
    CHECK(opjit_create(NULL, &rt) == OPJIT_OK);
    CHECK(rt && opjit_load_op(rt, src_path, &op) == OPJIT_OK);
    opjit_value a[2] = {opjit_tensor(&bt), opjit_int(0)};
    DLManagedTensor *outs[2] = {NULL, NULL};
    void *first = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK(op && opjit_call(rt, op, a, 2, outs, 2) == OPJIT_OK);
        if (!outs[0])
            break;
        CHECK(((float *)outs[0]->dl_tensor.data)[99999] == 1.0f);
        if (i == 0)
            first = outs[0]->dl_tensor.data;
        else
            CHECKF(outs[0]->dl_tensor.data == first, "call %d: a new block, not the first's", i);
        if (i < 2)
            free_outs(outs);
    }
    opjit_destroy(rt); /* outs stay valid */
    if (outs[0])
        CHECK(((float *)outs[0]->dl_tensor.data)[0] == 1.0f);
    free_outs(outs);
    if (old)
        setenv("OPJIT_OUTPUT_CACHE", saved, 1);
    else
        unsetenv("OPJIT_OUTPUT_CACHE");
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/opjit-test-alloc-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    if (!getenv("OPJIT_CACHE_DIR")) {
        char c[600];
        snprintf(c, sizeof c, "%s/cache", tmp_dir);
        setenv("OPJIT_CACHE_DIR", c, 1);
    }
    snprintf(src_path, sizeof src_path, "%s/qaa_op.c", tmp_dir);
    FILE *f = fopen(src_path, "wb");
    if (!f || fwrite(op_source, 1, sizeof op_source - 1, f) != sizeof op_source - 1 || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", src_path);
        return 1;
    }
    T_RUN(outputs_and_workspaces_come_from_the_allocator);
    T_RUN(injected_failures_cold);
    T_RUN(injected_failures_warm);
    T_RUN(an_allocator_that_always_fails);
    T_RUN(default_allocator_reuses_large_outputs);
    nftw(tmp_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return t_done();
}
