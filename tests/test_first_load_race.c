/* tests/test_first_load_race.c - the first loads of a process, from many
 * threads over two runtimes at once: whatever the loader computes once per
 * process (the target triple, the toolkit's include directory) is computed
 * once, race-free. It asserts results here; the thread tests' pass of
 * scripts/test runs it under ThreadSanitizer, which reports the race. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "opjit.h"
#include "t.h"

#define NTHREADS 6

static opjit_runtime *rts[2];
static pthread_barrier_t start;
static int results[NTHREADS];

static void *load_and_call(void *arg)
{
    int i = (int)(intptr_t)arg;
    opjit_runtime *rt = rts[i % 2];
    pthread_barrier_wait(&start);
    opjit_op *op = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/mm.c", getenv("OPJIT_OPS_PATH"));
    if (opjit_load_file(rt, path, &op, NULL) != OPJIT_OK) {
        fprintf(stderr, "thread %d: %s\n", i, opjit_errmsg(rt));
        return NULL;
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1};
    int64_t shape[2] = {2, 2};
    DLTensor ta = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
    DLTensor tb = {b, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
    opjit_value args[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
    DLManagedTensor *out = NULL;
    if (opjit_call(rt, op, args, 2, &out, 1) == OPJIT_OK) {
        const float *y = out->dl_tensor.data;
        results[i] = y[0] == 1 && y[1] == 2 && y[2] == 3 && y[3] == 4;
        out->deleter(out);
    }
    return NULL;
}

static void first_loads_on_two_runtimes_at_once(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    if (!getenv("OPJIT_OPS_PATH")) {
        fprintf(stderr, "OPJIT_OPS_PATH must name ops-src\n");
        exit(77);
    }
    for (int r = 0; r < 2; r++)
        CHECK(opjit_create(&cfg, &rts[r]) == OPJIT_OK);
    if (!rts[0] || !rts[1])
        return;
    pthread_t th[NTHREADS];
    pthread_barrier_init(&start, NULL, NTHREADS);
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, load_and_call, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < NTHREADS; i++)
        CHECKF(results[i], "thread %d", i);
    opjit_destroy(rts[0]);
    opjit_destroy(rts[1]);
}

int main(void)
{
    T_RUN(first_loads_on_two_runtimes_at_once);
    return t_done();
}
