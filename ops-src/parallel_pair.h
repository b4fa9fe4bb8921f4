/*
 * ops-src/parallel_pair.h - two loops of chunks in one parallel region
 * (mm_backward's two products): chunks 0 .. na - 1 are a's, the next nb
 * are b's, so that a thread done with its share of one takes the other's
 * instead of waiting at the end of a region of its own.
 */
#ifndef PARALLEL_PAIR_H
#define PARALLEL_PAIR_H

#include <opjit_op.h>

typedef struct parallel_pair {
    opjit_chunk_fn fa, fb;
    void *a, *b;
    int64_t na;
} parallel_pair;

static int parallel_pair_run(void *user, int64_t lo, int64_t hi)
{
    const parallel_pair *p = (const parallel_pair *)user;
    int rc = 0;
    if (lo < p->na)
        rc = p->fa(p->a, lo, hi < p->na ? hi : p->na);
    if (rc == 0 && hi > p->na)
        rc = p->fb(p->b, lo > p->na ? lo - p->na : 0, hi - p->na);
    return rc;
}

/* fa over chunks [0, na) of a and fb over [0, nb) of b, in one region. */
static int parallel_for_pair(opjit_ctx *ctx, opjit_chunk_fn fa, void *a, int64_t na,
                             opjit_chunk_fn fb, void *b, int64_t nb)
{
    parallel_pair p = {fa, fb, a, b, na};
    return opjit_parallel_for(ctx, 0, na + nb, 1, parallel_pair_run, &p);
}

#endif
