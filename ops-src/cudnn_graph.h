/*
 * ops-src/cudnn_graph.h - one convolution (forward, backward data or
 * backward filter) through cuDNN's graph API, as PyTorch runs its own: the
 * operation graph and an execution plan built once per shape, then each
 * call only packs its pointers and executes the plan. cuDNN 9's legacy
 * calls (cudnnConvolutionForward and its twins) rebuild the equivalent on
 * every call. A local header of conv2d.cu (part of its cache key).
 *
 *   cg_plan p;
 *   if (cg_graph(api, &conv, handle, &p) || cg_plan_build(api, &conv, &p)) ...
 *   cg_execute(api, handle, &p, x, w, y, workspace of p.workspace bytes);
 *   cg_plan_free(api, &p);
 *
 * The engines are cuDNN's heuristics' (instant mode, then its fallback
 * list), in their order; the first whose plan finalizes is kept. Engines
 * that down-convert their inputs or reduce in lower precision are skipped,
 * and in float32 and float64 those on tensor cores too (TF32 would not
 * match the CPU twin), as torch does with allow_tf32 off.
 *
 * cuDNN's functions come through cg_api: conv2d.cu takes them by dlsym at
 * its first call, a test hands the library's own.
 */
#ifndef OPJIT_CUDNN_GRAPH_H
#define OPJIT_CUDNN_GRAPH_H

#include <cudnn.h>
#include <stdint.h>
#include <string.h>

typedef struct cg_api {
    __typeof__(cudnnBackendCreateDescriptor) *create;
    __typeof__(cudnnBackendDestroyDescriptor) *destroy;
    __typeof__(cudnnBackendSetAttribute) *set;
    __typeof__(cudnnBackendGetAttribute) *get;
    __typeof__(cudnnBackendFinalize) *finalize;
    __typeof__(cudnnBackendExecute) *execute;
} cg_api;

/* The directions: which tensor is the result. */
enum { CONV_FWD = 0, CONV_BWD_DATA = 1, CONV_BWD_FILTER = 2 };

/* One convolution: dense NCHW tensors x [N, C, H, W], w [O, C/groups, kH,
 * kW], y [N, O, Ho, Wo] (groups follow from C and w's second dimension);
 * in backward data x is the result dx and y the gradient dy, in backward
 * filter w is the result dw. */
typedef struct cg_conv {
    int kind;             /* CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER */
    cudnnDataType_t data; /* the tensors' type; sums in double for double, else float */
    int64_t x[4], w[4], y[4];
    int64_t pad[2], stride[2], dilation[2];
    int64_t align; /* bytes every pointer of a call is aligned to */
} cg_conv;

/* The descriptors, kept for the plan's life. */
enum { CG_X, CG_W, CG_Y, CG_CONV, CG_OP, CG_GRAPH, CG_CFG, CG_PLAN, CG_NDESC };

typedef struct cg_plan {
    cudnnBackendDescriptor_t d[CG_NDESC];
    int64_t workspace; /* bytes a call needs */
    const char *what;  /* the step that failed */
} cg_plan;

#define CG_MAX_CONFIGS 32

static inline cudnnStatus_t cg_tensor(const cg_api *api, cudnnBackendDescriptor_t *t, int64_t uid,
                                      const int64_t dim[4], cudnnDataType_t dt, int64_t align)
{
    int64_t stride[4];
    cudnnStatus_t st;
    stride[3] = 1;
    stride[2] = dim[3];
    stride[1] = dim[2] * dim[3];
    stride[0] = dim[1] * stride[1];
    if ((st = api->create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t)))
        return st;
    if ((st = api->set(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)) ||
        (st = api->set(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim)) ||
        (st = api->set(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride)) ||
        (st = api->set(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)) ||
        (st = api->set(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align)))
        return st;
    return api->finalize(*t);
}

static inline cudnnDataType_t cg_compute(const cg_conv *c)
{
    return c->data == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

static inline cudnnStatus_t cg_conv_desc(const cg_api *api, cudnnBackendDescriptor_t *d,
                                         const cg_conv *c)
{
    int64_t dims = 2;
    cudnnDataType_t compute = cg_compute(c);
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnStatus_t st;
    if ((st = api->create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, d)))
        return st;
    if ((st = api->set(*d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims)) ||
        (st = api->set(*d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)) ||
        (st = api->set(*d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1,
                       &mode)) ||
        (st = api->set(*d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, c->pad)) ||
        (st = api->set(*d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, c->pad)) ||
        (st = api->set(*d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, c->dilation)) ||
        (st = api->set(*d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, c->stride)))
        return st;
    return api->finalize(*d);
}

/* The operation of c->kind on p's tensors and convolution. */
static inline cudnnStatus_t cg_operation(const cg_api *api, const cg_conv *c, cg_plan *p)
{
    /* Per direction: the operation, then its x, w, y, convolution, alpha
     * and beta attributes. */
    static const int attrs[3][7] = {
        {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
        {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
        {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA}};
    const int *a = attrs[c->kind];
    double one_d = 1.0, zero_d = 0.0;
    float one_f = 1.0f, zero_f = 0.0f;
    int is64 = cg_compute(c) == CUDNN_DATA_DOUBLE;
    cudnnBackendAttributeType_t scalar = is64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
    const void *one = is64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = is64 ? (const void *)&zero_d : (const void *)&zero_f;
    cudnnBackendDescriptor_t *op = &p->d[CG_OP];
    cudnnStatus_t st;
    int i;
    if ((st = api->create((cudnnBackendDescriptorType_t)a[0], op)))
        return st;
    for (i = 0; i < 4; i++) /* x, w, y, the convolution: p->d[CG_X + i] */
        if ((st = api->set(*op, (cudnnBackendAttributeName_t)a[1 + i],
                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p->d[CG_X + i])))
            return st;
    if ((st = api->set(*op, (cudnnBackendAttributeName_t)a[5], scalar, 1, one)) ||
        (st = api->set(*op, (cudnnBackendAttributeName_t)a[6], scalar, 1, zero)))
        return st;
    return api->finalize(*op);
}

/* c's operation graph into p (zeroed first; p->what names a failed step).
 * handle, when not NULL, ties it to that handle's device; cuDNN 9.x takes
 * the current device without it. */
static inline cudnnStatus_t cg_graph(const cg_api *api, const cg_conv *c, cudnnHandle_t handle,
                                     cg_plan *p)
{
    cudnnStatus_t st;
    memset(p, 0, sizeof *p);
    p->what = "tensor descriptors";
    if ((st = cg_tensor(api, &p->d[CG_X], 1, c->x, c->data, c->align)) ||
        (st = cg_tensor(api, &p->d[CG_W], 2, c->w, c->data, c->align)) ||
        (st = cg_tensor(api, &p->d[CG_Y], 3, c->y, c->data, c->align)))
        return st;
    p->what = "convolution descriptor";
    if ((st = cg_conv_desc(api, &p->d[CG_CONV], c)))
        return st;
    p->what = "convolution operation";
    if ((st = cg_operation(api, c, p)))
        return st;
    p->what = "operation graph";
    if ((st = api->create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &p->d[CG_GRAPH])) ||
        (st = api->set(p->d[CG_GRAPH], CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                       1, &p->d[CG_OP])))
        return st;
    /* Deprecated in 9.x, still honoured: a cuDNN that refuses it uses the
     * current device, which the call's is. */
    if (handle)
        api->set(p->d[CG_GRAPH], CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    return api->finalize(p->d[CG_GRAPH]);
}

/* Whether engine configuration cfg computes as c asks (see the top). */
static inline int cg_config_fits(const cg_api *api, const cg_conv *c, cudnnBackendDescriptor_t cfg)
{
    cudnnBackendDescriptor_t engine = NULL;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0, got = 0, i;
    int fits = 1, wide = c->data == CUDNN_DATA_FLOAT || c->data == CUDNN_DATA_DOUBLE;
    if (api->create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine))
        return 0;
    if (api->get(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                 &engine) ||
        api->get(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes))
        fits = 0;
    for (i = 0; fits && i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
            notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
            (wide && notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
            fits = 0;
    api->destroy(engine);
    return fits;
}

/* The plan of the first fitting engine in heuristic mode's list into p:
 * CUDNN_STATUS_SUCCESS, CUDNN_STATUS_NOT_SUPPORTED when none fits and
 * finalizes, or the status of the step that failed. */
static inline cudnnStatus_t cg_plan_from(const cg_api *api, const cg_conv *c, cg_plan *p,
                                         cudnnBackendHeurMode_t mode)
{
    cudnnBackendDescriptor_t heur = NULL, cfg[CG_MAX_CONFIGS];
    int64_t n = 0, i, bytes = 0, got = 0;
    cudnnStatus_t st;
    memset(cfg, 0, sizeof cfg);
    p->what = "engine heuristics";
    if ((st = api->create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur)) ||
        (st = api->set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                       1, &p->d[CG_GRAPH])) ||
        (st = api->set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)) ||
        (st = api->finalize(heur)))
        goto out;
    for (n = 0; n < CG_MAX_CONFIGS; n++)
        if ((st = api->create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[n])))
            goto out;
    if ((st = api->get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                       CG_MAX_CONFIGS, &got, cfg)))
        goto out;
    st = CUDNN_STATUS_NOT_SUPPORTED;
    p->what = "execution plan";
    for (i = 0; i < got && i < CG_MAX_CONFIGS && !p->d[CG_PLAN]; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (!cg_config_fits(api, c, cfg[i]) ||
            api->create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan))
            continue;
        if (!api->set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                      1, &cfg[i]) &&
            !api->finalize(plan) &&
            !api->get(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &bytes,
                      &p->workspace) &&
            bytes == 1 && p->workspace >= 0) {
            p->d[CG_PLAN] = plan;
            p->d[CG_CFG] = cfg[i]; /* the plan's; kept with it */
            cfg[i] = NULL;
            st = CUDNN_STATUS_SUCCESS;
        } else {
            api->destroy(plan);
            p->workspace = 0;
        }
    }
out:
    for (i = 0; i < n; i++)
        if (cfg[i])
            api->destroy(cfg[i]);
    if (heur)
        api->destroy(heur);
    return st;
}

/* An execution plan for p's graph (cg_graph's): heuristics' instant list,
 * then their fallback list. */
static inline cudnnStatus_t cg_plan_build(const cg_api *api, const cg_conv *c, cg_plan *p)
{
    cudnnStatus_t st = cg_plan_from(api, c, p, CUDNN_HEUR_MODE_INSTANT);
    if (st == CUDNN_STATUS_NOT_SUPPORTED)
        st = cg_plan_from(api, c, p, CUDNN_HEUR_MODE_FALLBACK);
    return st;
}

/* Queue p's convolution on handle's stream: x, w, y as cg_conv says,
 * workspace of p->workspace bytes (NULL when 0). */
static inline cudnnStatus_t cg_execute(const cg_api *api, cudnnHandle_t handle, const cg_plan *p,
                                       void *x, void *w, void *y, void *workspace)
{
    int64_t uids[3] = {1, 2, 3};
    void *ptrs[3];
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st;
    ptrs[0] = x;
    ptrs[1] = w;
    ptrs[2] = y;
    if ((st = api->create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack)))
        return st;
    if (!(st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)) &&
        !(st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3,
                        ptrs)) &&
        !(st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                        &workspace)) &&
        !(st = api->finalize(pack)))
        st = api->execute(handle, p->d[CG_PLAN], pack);
    api->destroy(pack);
    return st;
}

/* Destroy p's descriptors, the plan first. */
static inline void cg_plan_free(const cg_api *api, cg_plan *p)
{
    int i;
    for (i = CG_NDESC - 1; i >= 0; i--)
        if (p->d[i])
            api->destroy(p->d[i]);
    memset(p, 0, sizeof *p);
}

#endif
