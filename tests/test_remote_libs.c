/* tests/test_remote_libs.c - a host pays only for what it uses (#26.2):
 * a process that loads and calls ops without a remote cache never loads
 * the Redis client (libhiredis) or libcrypto; one that configures a
 * remote layer loads them when its cache is opened. */
#include <stdlib.h>

#include "opjit.h"
#include "t.h"

/* Whether a file whose name holds what is mapped into this process. */
static int mapped(const char *what)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, what) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void quiet(void *ud, int level, const char *msg)
{
    (void)ud, (void)level, (void)msg;
}

static void test_no_remote_loads_neither(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    cfg.remote_cache = ""; /* none, whatever the environment says */
    opjit_runtime *rt = NULL;
    opjit_op *op = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    char path[4096];
    snprintf(path, sizeof path, "%s/ops-src/nms.c", getenv("OPJIT_SOURCE_DIR"));
    CHECKF(opjit_load_file(rt, path, &op, NULL) == OPJIT_OK, "%s", opjit_errmsg(rt));
    opjit_destroy(rt);
    CHECK(!mapped("libhiredis"));
    CHECK(!mapped("libcrypto"));
}

static void test_remote_loads_both(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    cfg.remote_cache = "redis://127.0.0.1:1"; /* nobody answers: the layer is still set up */
    cfg.log = quiet;
    setenv("OPJIT_REMOTE_TRUST", "unsigned", 1);
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    CHECK(mapped("libhiredis"));
    CHECK(mapped("libcrypto"));
    opjit_destroy(rt);
    unsetenv("OPJIT_REMOTE_TRUST");
}

int main(void)
{
    unsetenv("OPJIT_REMOTE_CACHE");
    T_RUN(test_no_remote_loads_neither);
    T_RUN(test_remote_loads_both);
    return t_done();
}
