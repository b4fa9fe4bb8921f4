/* loader/ops_path.c - the search path: the configured and environment
 * directories (the settings'), then the ops shipped with this copy of the
 * library and the installed ones. Read by name lookups, the index and the
 * watcher; below loader.c and source.c. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader/loader_int.h"
#include "opjit_build_config.h"

int loader_library_dir(char *dir, size_t n, int *shared)
{
    Dl_info info;
    struct link_map *map = NULL;
    char self[PATH_MAX];
    if (!dladdr1((void *)&loader_ops_path, &info, (void **)&map, RTLD_DL_LINKMAP) || !map)
        return -1;
    *shared = map->l_name && map->l_name[0];
    if (*shared) { /* a shared object: libopjit.so */
        if (!realpath(map->l_name, self))
            return -1;
    } else { /* the executable */
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0 || (size_t)len >= sizeof self - 1)
            return -1;
        self[len] = '\0';
    }
    char *slash = strrchr(self, '/');
    if (!slash || (size_t)(slash - self) >= n)
        return -1;
    *slash = '\0';
    memcpy(dir, self, (size_t)(slash - self) + 1);
    return 0;
}

/* The ops shipped with this copy of the library, found from where it is
 * loaded: <directory of libopjit.so>/<libdir to datadir>/opjit/ops, or from
 * the executable's bindir when libopjit.a is linked into it. NULL when that
 * directory does not exist or is the configure-time one. */
static char *relocated_ops_dir(void)
{
    char self[PATH_MAX], dir[PATH_MAX], real[PATH_MAX], conf[PATH_MAX];
    int shared;
    if (loader_library_dir(self, sizeof self, &shared) != 0)
        return NULL;
    const char *rel = shared ? OPJIT_DATADIR_FROM_LIBDIR : OPJIT_DATADIR_FROM_BINDIR;
    struct stat st;
    /* Mostly absent (a build tree, a host of its own): one stat says so. */
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s/opjit/ops", self, rel) >= sizeof dir ||
        stat(dir, &st) != 0 || !realpath(dir, real) || strchr(real, ':'))
        return NULL;
    if (realpath(OPJIT_INSTALLED_OPS_DIR, conf) && strcmp(real, conf) == 0)
        return NULL;
    return strdup(real);
}

/* Defined (weak) by a host of libopjit.a built with OPJIT_STATIC_OPS_DIR
 * (opjit.h): where the ops of the installed tree it was built against are. */
extern const char opjit_static_ops_dir[] __attribute__((weak));

/* The installed ops a host of libopjit.a was built against, when that
 * directory exists and is not found otherwise; else "". */
static const char *static_host_ops_dir(const char *moved)
{
    const char *dir = opjit_static_ops_dir;
    char real[PATH_MAX];
    if (!dir || !*dir || strchr(dir, ':') || !realpath(dir, real) ||
        (moved && !strcmp(real, moved)))
        return "";
    return dir;
}

/* Where this copy of the library finds its shipped and installed ops:
 * it does not move while the process runs, so it is looked up once. */
static char *shipped_moved;
static const char *shipped_host, *shipped_installed;
static pthread_once_t shipped_once = PTHREAD_ONCE_INIT;

static void shipped_find(void)
{
    shipped_moved = relocated_ops_dir();
    shipped_host = static_host_ops_dir(shipped_moved);
    shipped_installed = access(OPJIT_INSTALLED_OPS_DIR, X_OK) == 0 ? OPJIT_INSTALLED_OPS_DIR : "";
}

/* The non-empty parts joined by ':', malloc'd; NULL when out of memory. */
static char *path_join(const char *const *part, size_t nparts)
{
    size_t n = 1;
    for (size_t i = 0; i < nparts; i++)
        n += part[i] ? strlen(part[i]) + 1 : 0;
    char *path = malloc(n);
    if (path) {
        size_t k = 0;
        path[0] = '\0';
        for (size_t i = 0; i < nparts; i++)
            if (part[i] && *part[i])
                k += (size_t)snprintf(path + k, n - k, "%s%s", k ? ":" : "", part[i]);
    }
    return path;
}

/* The search path: config, $OPJIT_OPS_PATH (both as they were when the
 * runtime was made), the ops shipped with this copy of the library (next
 * to it, or as a static host was told), the installed ones (where they
 * exist). Made at its first use: a load by path never needs it, so a
 * host that loads files does not look for the shipped ops. "" when out
 * of memory. */
const char *loader_ops_path(loader *l)
{
    pthread_mutex_lock(&l->ops_lock);
    if (!l->ops_path) {
        pthread_once(&shipped_once, shipped_find);
        const char *part[] = {l->ops_head, shipped_moved, shipped_host, shipped_installed};
        l->ops_path = path_join(part, sizeof part / sizeof *part);
    }
    const char *p = l->ops_path ? l->ops_path : "";
    pthread_mutex_unlock(&l->ops_lock);
    return p;
}

int ops_path_init(loader *l)
{
    const char *head[] = {l->rt->set.ops_path_cfg, l->rt->set.ops_path_env};
    return (l->ops_head = path_join(head, 2)) ? OPJIT_OK : OPJIT_ENOMEM;
}
