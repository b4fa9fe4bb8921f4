/* tests/test_abi.c - the size-first structs of opjit.h ("Structs that
 * grow"), from the side tests/test_abi_grow.sh does not cover: sizes
 * below the first version, and hosts newer than the library (a struct
 * larger than the library's, its unknown fields zero or set). */
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "t.h"
#include <opjit.h>
#include <opjit_admin.h>

/* A config as a newer header might have it: one field more. */
typedef struct newer_config {
    opjit_config c;
    int added;
} newer_config;

static void test_config_init_sizes(void)
{
    opjit_config cfg;
    CHECK(opjit_config_init(NULL, sizeof cfg) == OPJIT_EINVAL);
    CHECK(opjit_config_init(&cfg, 0) == OPJIT_EINVAL);
    CHECK(opjit_config_init(&cfg, offsetof(opjit_config, remote_push)) == OPJIT_EINVAL);
    CHECK(opjit_config_init(&cfg, sizeof cfg) == OPJIT_OK && cfg.size == sizeof cfg);
    newer_config n;
    memset(&n, 0x77, sizeof n);
    CHECK(opjit_config_init(&n.c, sizeof n) == OPJIT_OK);
    CHECK(n.c.size == sizeof n && n.c.tiering == -1);
    CHECK(n.added == 0); /* what the library does not know: zeroed */
}

static void test_create_sizes(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    opjit_runtime *rt = (opjit_runtime *)&cfg;
    cfg.size = 8;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_EINVAL && !rt);

    newer_config n;
    opjit_config_init(&n.c, sizeof n);
    n.c.tiering = 0;
    n.c.num_threads = 2;
    n.added = 0; /* unknown but zero: the default a newer library would have */
    CHECK(opjit_create(&n.c, &rt) == OPJIT_OK && rt);
    int threads = 0;
    CHECK(opjit_num_threads_get(rt, &threads) == OPJIT_OK && threads == 2);
    opjit_destroy(rt);
    n.added = 1; /* asks for what this library cannot do */
    CHECK(opjit_create(&n.c, &rt) == OPJIT_EINVAL && !rt);
}

static void test_output_sizes(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    if (!rt)
        return;
    opjit_cache_info small = {.size = sizeof(size_t)};
    CHECK(opjit_cache_info_get(rt, &small) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "opjit_cache_info.size is 8");
    struct {
        opjit_cache_info i;
        unsigned char added[16];
    } big;
    memset(&big, 0x77, sizeof big);
    big.i.size = sizeof big;
    CHECK(opjit_cache_info_get(rt, &big.i) == OPJIT_OK);
    CHECK(big.i.size == sizeof big && big.i.dir != NULL);
    unsigned char host[16];
    memset(host, 0x77, sizeof host);
    CHECK(!memcmp(big.added, host, sizeof host)); /* not the library's to write */
    /* A size never set (what the stack held): refused, nothing written. */
    memset(&big, 0x77, sizeof big);
    CHECK(opjit_cache_info_get(rt, &big.i) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "far past any");
    CHECK(big.i.dir == (const char *)(uintptr_t)0x7777777777777777ull);
    opjit_load_info li;
    memset(&li, 0x77, sizeof li);
    CHECK(opjit_load_file(rt, "/nonexistent/x.c", NULL, &li) == OPJIT_EINVAL);
    opjit_warm_options wo = {.size = 4};
    CHECK(opjit_warm(rt, &wo, NULL, NULL, NULL) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "opjit_warm_options.size is 4");
    opjit_destroy(rt);
}

int main(void)
{
    T_RUN(test_config_init_sizes);
    T_RUN(test_create_sizes);
    T_RUN(test_output_sizes);
    return t_done();
}
