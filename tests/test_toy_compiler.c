/* tests/test_toy_compiler.c - the compiler table holds: a build with an
 * extra entry (cmake -DOPJIT_EXTRA_COMPILER=tests/toy_compiler.c:jit_toy,
 * which adds that file and one line of jit/compilers.c, nothing else)
 * loads, lists and calls a .c op through it. Skipped (77) in builds
 * without the entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jit/jit.h"
#include "opjit_admin.h"
#include "t.h"

static const char *op_text =
    "#include <opjit_op.h>\n"
    "static int which(opjit_ctx *ctx, opjit_args *a) {\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);\n"
    "    if (!y) return -1;\n"
    "#ifdef OPJIT_TOY\n"
    "    ((float *)y->data)[0] = 42.0f;\n"
    "#else\n"
    "    ((float *)y->data)[0] = 1.0f;\n"
    "#endif\n"
    "    return 0;\n"
    "}\n"
    "OPJIT_MODULE(which, m) {\n"
    "    opjit_def(m, \"which(Tensor x) -> Tensor\", OPJIT_CPU, which, \"which compiler\");\n"
    "}\n";

static int list_tier(void *ud, const opjit_source_ops *src)
{
    if (strstr(src->path, "/which.c"))
        snprintf(ud, 32, "%s", src->tier ? src->tier : "(none)");
    return 0;
}

static void test_toy_serves(void)
{
    char dir[] = "/tmp/opjit-toy-XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/which.c", dir);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(op_text, f) >= 0 && fclose(f) == 0);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    cfg.ops_path = dir;
    unsetenv("OPJIT_OPS_PATH"); /* list this directory only */
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    CHECKF(opjit_load_file(rt, path, &op, &info) == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECKF(!strcmp(info.tier, "toy"), "served by %s", info.tier);
    float x = 0, *y;
    int64_t shape[1] = {1};
    DLTensor t = {.data = &x, .device = {kDLCPU, 0}, .ndim = 1,
                  .dtype = {kDLFloat, 32, 1}, .shape = shape};
    opjit_value arg = {.kind = OPJIT_KIND_TENSOR, .u.tensor = &t};
    DLManagedTensor *out = NULL;
    CHECKF(op && opjit_call(rt, op, &arg, 1, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        y = out->dl_tensor.data;
        CHECKF(y[0] == 42.0f, "the kernel says %g: not compiled by the toy", y[0]);
        out->deleter(out);
    }
    char tier[32] = "";
    CHECK(opjit_discover(rt, list_tier, tier) == OPJIT_OK);
    CHECKF(!strcmp(tier, "toy"), "listed as %s", tier);
    opjit_destroy(rt);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    if (strcmp(jit_compilers[0]->name, "toy")) {
        fprintf(stderr, "skipped: built without -DOPJIT_EXTRA_COMPILER=tests/toy_compiler.c:jit_toy\n");
        return 77;
    }
    T_RUN(test_toy_serves);
    return t_done();
}
