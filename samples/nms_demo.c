/* samples/nms_demo.c - a host application embedding opjit.
 *
 * Loads the nms operator by name from the search path ($OPJIT_OPS_PATH),
 * runs it on generated detection boxes and prints how many boxes survive
 * and how long loading and calling took.
 *
 *   OPJIT_OPS_PATH=ops-src ./build/nms_demo [boxes] [iou_threshold]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "opjit.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Clusters of jittered boxes around random centres, as a detector emits. */
static void make_boxes(int n, float *boxes, float *scores)
{
    unsigned s = 12345;
#define RND() ((s = s * 1103515245u + 12345u) >> 8 & 0xffff) / 65535.0f
    for (int i = 0; i < n; i++) {
        if (i % 8 == 0) {
            boxes[4 * i + 0] = RND() * 900.0f;
            boxes[4 * i + 1] = RND() * 900.0f;
            boxes[4 * i + 2] = boxes[4 * i + 0] + 20.0f + RND() * 80.0f;
            boxes[4 * i + 3] = boxes[4 * i + 1] + 20.0f + RND() * 80.0f;
        } else {
            const float *c = &boxes[4 * (i - i % 8)];
            for (int k = 0; k < 4; k++)
                boxes[4 * i + k] = c[k] + (RND() - 0.5f) * 12.0f;
        }
        scores[i] = RND();
    }
#undef RND
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    double thr = argc > 2 ? atof(argv[2]) : 0.5;
    if (n < 0) {
        fprintf(stderr, "usage: nms_demo [boxes] [iou_threshold]\n");
        return 2;
    }
    opjit_runtime *rt;
    int rc = opjit_create(NULL, &rt);
    if (rc) {
        fprintf(stderr, "nms_demo: cannot create the runtime: %s\n", opjit_errstr(rc));
        return 1;
    }
    double t0 = now_ms();
    opjit_op *nms;
    rc = opjit_load_op(rt, "nms", &nms);
    double t_load = now_ms() - t0;
    if (rc) {
        fprintf(stderr, "nms_demo: %s\n", opjit_errmsg(rt));
        opjit_destroy(rt);
        return 1;
    }

    float *boxes = malloc(sizeof(float) * 4 * (size_t)(n ? n : 1));
    float *scores = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!boxes || !scores) {
        fprintf(stderr, "nms_demo: out of memory\n");
        return 1;
    }
    make_boxes(n, boxes, scores);
    int64_t bshape[2] = {n, 4}, sshape[1] = {n};
    DLTensor tb = {boxes, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, bshape, NULL, 0};
    DLTensor ts = {scores, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, sshape, NULL, 0};
    opjit_value args[3] = {opjit_tensor(&tb), opjit_tensor(&ts), opjit_float(thr)};

    DLManagedTensor *keep = NULL;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        if (keep)
            keep->deleter(keep);
        double t1 = now_ms();
        rc = opjit_call(rt, nms, args, 3, &keep, 1);
        double dt = now_ms() - t1;
        if (rc) {
            fprintf(stderr, "nms_demo: %s\n", opjit_errmsg(rt));
            return 1;
        }
        if (dt < best)
            best = dt;
    }
    const int64_t *idx = keep->dl_tensor.data;
    int64_t kept = keep->dl_tensor.shape[0];
    printf("nms: %d boxes, IoU threshold %.2f -> kept %lld\n", n, thr, (long long)kept);
    printf("first kept:");
    for (int64_t i = 0; i < kept && i < 8; i++)
        printf(" %lld", (long long)idx[i]);
    printf("\nload (compile or cache hit + register): %.2f ms\ncall (best of 5): %.3f ms\n",
           t_load, best);
    keep->deleter(keep);
    free(boxes);
    free(scores);
    opjit_destroy(rt);
    return 0;
}
