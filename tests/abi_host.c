/* tests/abi_host.c - a host built against include/opjit.h as it is, run
 * by tests/test_abi_grow.sh on libopjit.so as built and on one whose
 * public structs have grown (a later version). Each struct it hands in
 * is followed by guard bytes the library must not touch, and what it set
 * must be what the library used.
 * Usage: abi_host CACHE_DIR OPS_DIR */
#include <stdio.h>
#include <string.h>

#include <opjit.h>
#include <opjit_admin.h>

#define GUARD 512
static int failed;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failed |= !ok;
}

/* Whether the GUARD bytes at p still hold the pattern. */
static int intact(const unsigned char *p)
{
    for (int i = 0; i < GUARD; i++)
        if (p[i] != 0x5a)
            return 0;
    return 1;
}

#define GUARDED(type) struct { type v; unsigned char guard[GUARD]; }

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: abi_host CACHE_DIR OPS_DIR\n");
        return 2;
    }
    GUARDED(opjit_config) cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    check(opjit_config_init(&cfg.v, sizeof cfg.v) == OPJIT_OK, "opjit_config_init");
    check(intact(cfg.guard), "opjit_config_init writes only sizeof(opjit_config) bytes");
    check(cfg.v.size == sizeof cfg.v && cfg.v.offline == -1 && cfg.v.tiering == -1 &&
              cfg.v.watch == -1 && cfg.v.verbosity == OPJIT_LOG_WARN && !cfg.v.cache_dir,
          "its defaults");
    cfg.v.cache_dir = argv[1];
    cfg.v.ops_path = argv[2];
    cfg.v.tiering = 0;
    cfg.v.num_threads = 3;
    cfg.v.remote_cache = "";
    opjit_runtime *rt = NULL;
    int rc = opjit_create(&cfg.v, &rt);
    check(rc == OPJIT_OK && rt, "opjit_create");
    if (!rt)
        return 1;
    check(intact(cfg.guard), "opjit_create leaves the bytes past the config alone");
    int n = 0;
    check(opjit_num_threads_get(rt, &n) == OPJIT_OK && n == 3, "num_threads is the host's 3");

    GUARDED(opjit_load_info) li;
    memset(&li, 0x5a, sizeof li);
    li.v.size = sizeof li.v;
    opjit_op *op = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/nms.c", argv[2]);
    rc = opjit_load_file(rt, path, &op, &li.v);
    if (rc)
        printf("     %s\n", opjit_errmsg(rt));
    check(rc == OPJIT_OK && op, "opjit_load_file nms.c");
    check(intact(li.guard), "opjit_load_file writes only sizeof(opjit_load_info) bytes");
    check(li.v.size == sizeof li.v && strstr(li.v.source, "nms.c") && !li.v.cache_hit &&
              !strcmp(li.v.tier, "tcc"),
          "the load info");

    GUARDED(opjit_op_info) oi;
    memset(&oi, 0x5a, sizeof oi);
    oi.v.size = sizeof oi.v;
    check(op && opjit_op_info_get(rt, op, &oi.v) == OPJIT_OK && !strcmp(oi.v.name, "nms") &&
              oi.v.nargs == 3,
          "opjit_op_info_get");
    check(intact(oi.guard), "opjit_op_info_get writes only sizeof(opjit_op_info) bytes");

    GUARDED(opjit_arg_info) ai;
    memset(&ai, 0x5a, sizeof ai);
    ai.v.size = sizeof ai.v;
    check(op && opjit_op_arg_get(rt, op, 2, &ai.v) == OPJIT_OK && !strcmp(ai.v.name, "iou_threshold"),
          "opjit_op_arg_get");
    check(intact(ai.guard), "opjit_op_arg_get writes only sizeof(opjit_arg_info) bytes");

    GUARDED(opjit_cache_info) ci;
    memset(&ci, 0x5a, sizeof ci);
    ci.v.size = sizeof ci.v;
    check(opjit_cache_info_get(rt, &ci.v) == OPJIT_OK && ci.v.entries >= 1 &&
              !strcmp(ci.v.dir, argv[1]),
          "opjit_cache_info_get: the host's cache_dir holds the entry");
    check(intact(ci.guard), "opjit_cache_info_get writes only sizeof(opjit_cache_info) bytes");

    GUARDED(opjit_cache_prune_result) pr;
    memset(&pr, 0x5a, sizeof pr);
    pr.v.size = sizeof pr.v;
    check(opjit_cache_prune(rt, 0, &pr.v) == OPJIT_OK, "opjit_cache_prune");
    check(intact(pr.guard), "opjit_cache_prune writes only sizeof(opjit_cache_prune_result) bytes");

    GUARDED(opjit_cache_remote_info) ri;
    memset(&ri, 0x5a, sizeof ri);
    ri.v.size = sizeof ri.v;
    check(opjit_cache_remote_info_get(rt, &ri.v) == OPJIT_OK && !ri.v.enabled,
          "opjit_cache_remote_info_get");
    check(intact(ri.guard), "opjit_cache_remote_info_get writes only its size");

    GUARDED(opjit_warm_options) wo;
    GUARDED(opjit_warm_result) wr;
    memset(&wo, 0x5a, sizeof wo);
    memset(&wr, 0x5a, sizeof wr);
    memset(&wo.v, 0, sizeof wo.v);
    wo.v.size = sizeof wo.v;
    const char *targets[] = {path};
    wo.v.targets = targets;
    wo.v.ntargets = 1;
    wr.v.size = sizeof wr.v;
    rc = opjit_warm(rt, &wo.v, NULL, NULL, &wr.v);
    if (rc)
        printf("     %s\n", opjit_errmsg(rt));
    check(rc == OPJIT_OK && wr.v.sources == 1 && wr.v.hits == 1, "opjit_warm: a hit");
    check(intact(wo.guard) && intact(wr.guard), "opjit_warm reads and writes only their sizes");

    opjit_destroy(rt);
    return failed;
}
