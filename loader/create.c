/* loader/create.c - opjit_create and opjit_destroy: the top of the library,
 * where the layers are assembled. The runtime (calls, dispatch) is made
 * first; the loader (sources, compilers through jit/, the cache) is built on
 * it and taken down before it. */
#include <stdlib.h>

#include "loader/loader_int.h"
#include "runtime/abi.h"

int opjit_create(const opjit_config *cfg, opjit_runtime **out)
{
    if (!out)
        return OPJIT_EINVAL;
    *out = NULL;
    /* From here on the config is this library's size. */
    opjit_config full;
    char err[256];
    int rc = config_from_host(cfg, &full, err, sizeof err);
    if (rc)
        return rc; /* no runtime to hold the message */
    settings set;
    rc = settings_resolve(&full, &set); /* the one reading of the environment */
    if (rc)
        return rc;
    opjit_runtime *rt;
    rc = loader_runtime_new(&set, &rt);
    settings_free(&set);
    if (rc)
        return rc;
    loader_warn_missing_dirs(rt->loader);
    if ((rc = watch_start(rt->loader))) {
        loader_runtime_free(rt);
        return rc;
    }
    *out = rt;
    return OPJIT_OK;
}

void opjit_destroy(opjit_runtime *rt)
{
    if (!rt)
        return;
    watch_stop(rt->loader); /* first: it loads into the loader */
    index_free(rt->loader);
    loader_runtime_free(rt);
}
