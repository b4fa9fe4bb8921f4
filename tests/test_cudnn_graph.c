/* tests/test_cudnn_graph.c - conv2d.cu's use of cuDNN's graph API
 * (ops-src/cudnn_graph.h) against the real libcudnn, on any machine that
 * has cuDNN 9 and its headers, GPU or not: every direction and dtype the op
 * sends builds an operation graph cuDNN accepts (its checks of shapes,
 * strides, types and attributes run at finalize, no device needed), a
 * graph that is not a convolution is refused at the step that says so, and
 * a plan where no device is fails cleanly. The plan's execution needs a
 * GPU: test_cuda_gpu runs conv2d through it there. Skips (77) without
 * cudnn.h at build time or libcudnn at run time. */
#include <stdio.h>

#include "t.h"

#ifndef OPJIT_TEST_CUDNN_H
int main(void)
{
    puts("skipped: cudnn.h was not found when this test was built");
    return 77;
}
#else
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
/* cuDNN's heuristics keep memory for the process (its engines' caches,
 * cuBLASLt handles): not the test's to free. */
#define CUDNN_OWN_MEMORY_BEGIN() __lsan_disable()
#define CUDNN_OWN_MEMORY_END() __lsan_enable()
#else
#define CUDNN_OWN_MEMORY_BEGIN() ((void)0)
#define CUDNN_OWN_MEMORY_END() ((void)0)
#endif

#include "jit/jit.h"
#include "ops-src/cudnn_graph.h"
#include "runtime/cuda.h"

static cg_api api;
static const char *(*error_string)(cudnnStatus_t);

static int api_load(void)
{
    static const char *const names[] = {"libcudnn.so.9", "libcudnn.so", NULL};
    char path[PATH_MAX], why[1024];
    void *h = jit_cuda_dlopen(names, getenv("OPJIT_CUDNN_LIBRARY"), RTLD_NOW | RTLD_LOCAL, path,
                              sizeof path, why, sizeof why);
    if (!h) {
        printf("skipped: no libcudnn: %s\n", why);
        return 0;
    }
#define API_SYM(field, name) *(void **)&api.field = dlsym(h, #name)
    API_SYM(create, cudnnBackendCreateDescriptor);
    API_SYM(destroy, cudnnBackendDestroyDescriptor);
    API_SYM(set, cudnnBackendSetAttribute);
    API_SYM(get, cudnnBackendGetAttribute);
    API_SYM(finalize, cudnnBackendFinalize);
    API_SYM(execute, cudnnBackendExecute);
#undef API_SYM
    *(void **)&error_string = dlsym(h, "cudnnGetErrorString");
    if (!api.create || !api.destroy || !api.set || !api.get || !api.finalize || !api.execute ||
        !error_string) {
        printf("skipped: %s lacks the backend API\n", path);
        return 0;
    }
    return 1;
}

/* The convolution of input [n, c, h, w] by weight [o, c/groups, k, k] as
 * conv2d.cu describes it. */
static cg_conv conv_of(int kind, cudnnDataType_t data, int64_t n, int64_t c, int64_t h,
                       int64_t w, int64_t o, int64_t groups, int64_t k, int64_t stride,
                       int64_t pad, int64_t dil)
{
    cg_conv cv;
    int64_t ho = (h + 2 * pad - dil * (k - 1) - 1) / stride + 1;
    int64_t wo = (w + 2 * pad - dil * (k - 1) - 1) / stride + 1;
    memset(&cv, 0, sizeof cv);
    cv.kind = kind;
    cv.data = data;
    cv.x[0] = n, cv.x[1] = c, cv.x[2] = h, cv.x[3] = w;
    cv.w[0] = o, cv.w[1] = c / groups, cv.w[2] = k, cv.w[3] = k;
    cv.y[0] = n, cv.y[1] = o, cv.y[2] = ho, cv.y[3] = wo;
    cv.pad[0] = cv.pad[1] = pad;
    cv.stride[0] = cv.stride[1] = stride;
    cv.dilation[0] = cv.dilation[1] = dil;
    cv.align = 16;
    return cv;
}

static const cudnnDataType_t dtypes[] = {CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF,
                                         CUDNN_DATA_BFLOAT16};
static const char *const kinds[] = {"forward", "backward data", "backward filter"};

static void test_every_direction_and_dtype_builds_a_graph(void)
{
    /* n, c, h, w, o, groups, k, stride, pad, dilation: ResNet-50's 3x3 and
     * strided 1x1, a grouped dilated one, a depthwise one. */
    static const int64_t shapes[][10] = {{1, 64, 56, 56, 64, 1, 3, 1, 1, 1},
                                         {8, 256, 56, 56, 512, 1, 1, 2, 0, 1},
                                         {2, 8, 17, 13, 12, 4, 3, 1, 2, 2},
                                         {1, 32, 9, 9, 32, 32, 3, 2, 1, 1}};
    for (int kind = 0; kind < 3; kind++)
        for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
                const int64_t *v = shapes[s];
                cg_conv cv = conv_of(kind, dtypes[t], v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                                     v[7], v[8], v[9]);
                cg_plan p;
                cudnnStatus_t st = cg_graph(&api, &cv, NULL, &p);
                CHECKF(st == CUDNN_STATUS_SUCCESS && p.d[CG_GRAPH],
                       "%s, dtype %d, shape %zu: %s at %s", kinds[kind], (int)dtypes[t], s,
                       error_string(st), p.what);
                CHECK(!p.d[CG_PLAN] && p.workspace == 0);
                cg_plan_free(&api, &p);
                for (int i = 0; i < CG_NDESC; i++)
                    CHECK(p.d[i] == NULL);
            }
}

static void test_a_graph_that_is_no_convolution_is_refused(void)
{
    cg_plan p;
    /* The output one row short of what the convolution makes. */
    cg_conv cv = conv_of(CONV_FWD, CUDNN_DATA_FLOAT, 1, 16, 20, 20, 16, 1, 3, 1, 1, 1);
    cv.y[2]--;
    CHECK(cg_graph(&api, &cv, NULL, &p) != CUDNN_STATUS_SUCCESS);
    CHECK(!strcmp(p.what, "convolution operation"));
    CHECK(p.d[CG_X] && p.d[CG_CONV] && !p.d[CG_GRAPH]);
    cg_plan_free(&api, &p);
    /* Channels the weight's groups cannot divide. */
    cv = conv_of(CONV_BWD_DATA, CUDNN_DATA_HALF, 1, 16, 20, 20, 16, 1, 3, 1, 1, 1);
    cv.w[1] = 5;
    CHECK(cg_graph(&api, &cv, NULL, &p) != CUDNN_STATUS_SUCCESS);
    CHECK(!strcmp(p.what, "convolution operation"));
    cg_plan_free(&api, &p);
    /* A tensor of a negative width. */
    cv = conv_of(CONV_BWD_FILTER, CUDNN_DATA_FLOAT, 1, 16, 20, 20, 16, 1, 3, 1, 1, 1);
    cv.x[3] = -1;
    CHECK(cg_graph(&api, &cv, NULL, &p) != CUDNN_STATUS_SUCCESS);
    CHECK(!strcmp(p.what, "tensor descriptors"));
    cg_plan_free(&api, &p);
}

static void test_a_plan_needs_a_device(void)
{
    char why[256];
    int gpu = cuda_available(why, sizeof why) == OPJIT_OK;
    for (int kind = 0; kind < 3; kind++) {
        cg_conv cv = conv_of(kind, CUDNN_DATA_FLOAT, 1, 64, 28, 28, 64, 1, 3, 1, 1, 1);
        cg_plan p;
        CHECK(cg_graph(&api, &cv, NULL, &p) == CUDNN_STATUS_SUCCESS);
        CUDNN_OWN_MEMORY_BEGIN();
        cudnnStatus_t st = cg_plan_build(&api, &cv, &p);
        CUDNN_OWN_MEMORY_END();
        if (gpu) { /* any engine of cuDNN's that computes in true float32 */
            CHECKF(st == CUDNN_STATUS_SUCCESS, "%s: %s at %s", kinds[kind],
                   error_string(st), p.what);
            CHECK(p.d[CG_PLAN] && p.d[CG_CFG] && p.workspace >= 0);
        } else {
            CHECK(st != CUDNN_STATUS_SUCCESS && !p.d[CG_PLAN] && !p.d[CG_CFG]);
        }
        cg_plan_free(&api, &p);
    }
}

int main(void)
{
    if (!api_load())
        return 77;
    T_RUN(test_every_direction_and_dtype_builds_a_graph);
    T_RUN(test_a_graph_that_is_no_convolution_is_refused);
    T_RUN(test_a_plan_needs_a_device);
    return t_done();
}
#endif
