/* jit/compilers.c - the table of compilers, and what they share: the
 * machine's triple and a cheap identity of a compiler's file. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <xxhash.h>

#include "jit/jit.h"

/* For each half, the compiler whose code runs faster comes first: a load
 * uses the first whose artifact is cached, else builds with the first
 * that is not a background compiler, and queues the background ones above
 * it. */
const jit_compiler *const jit_compilers[] = {&jit_cc, &jit_tcc, &jit_nvrtc, NULL};

static char host_triple[128];
static pthread_once_t host_triple_once = PTHREAD_ONCE_INIT;

static void host_triple_init(void)
{
    struct utsname u;
    snprintf(host_triple, sizeof host_triple, "%s-linux", uname(&u) == 0 ? u.machine : "unknown");
}

/* Once per process: runtimes on other threads read it at the same time. */
const char *jit_host_target(void)
{
    pthread_once(&host_triple_once, host_triple_init);
    return host_triple;
}

int jit_file_id(const char *prefix, const char *path, char *out, size_t n)
{
    char real[PATH_MAX], buf[PATH_MAX * 2 + 128];
    struct stat st;
    if (!path || !path[0] || !realpath(path, real) || stat(real, &st) != 0)
        return 0;
    int len = snprintf(buf, sizeof buf, "%s\n%s\n%llu %llu %lld %lld.%09ld", path, real,
                       (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                       (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)len < sizeof buf ? (size_t)len : sizeof buf);
    snprintf(out, n, "%s:%016llx%016llx", prefix, (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    return 1;
}
