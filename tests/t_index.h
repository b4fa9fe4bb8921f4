/* tests/t_index.h - a runtime for the index and listing tests: no
 * background compile (it would add cache entries), debug logging counted
 * into t_nlogs_indexed ("indexed ..." lines: a child looked at a source)
 * and t_nlogs_note_hits (an index note read from the cache). Both counters
 * restart at each t_index_rt. */
#ifndef OPJIT_TEST_T_INDEX_H
#define OPJIT_TEST_T_INDEX_H
#include <string.h>

#include "opjit.h"
#include "t.h"

static int t_nlogs_indexed, t_nlogs_note_hits;

static void t_index_count_log(void *ud, int level, const char *msg)
{
    (void)ud, (void)level;
    if (!strncmp(msg, "indexed ", 8))
        t_nlogs_indexed++;
    if (!strncmp(msg, "cache: ", 7) && strstr(msg, " index ") && strstr(msg, "hit"))
        t_nlogs_note_hits++;
}

static opjit_runtime *t_index_rt(const char *ops_path)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = ops_path;
    cfg.tiering = 0;
    cfg.log = t_index_count_log;
    cfg.verbosity = OPJIT_LOG_DEBUG;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    t_nlogs_indexed = t_nlogs_note_hits = 0;
    return rt;
}
#endif
