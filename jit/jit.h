/* jit/jit.h - compilers: each turns source text into an artifact file and
 * diagnostics. Knows nothing of the cache or the runtime. */
#ifndef OPJIT_JIT_H
#define OPJIT_JIT_H

#include <limits.h>
#include <stddef.h>
#include <sys/stat.h>
/* ---- the compilers, as one table ------------------------------------------
 *
 * Every compiler is one jit_compiler: what goes into the keys of its
 * artifacts (identity, options, target), the targets a machine needs, the
 * names of its artifacts, and compile(). The loader's pipeline (loader/
 * pipeline.c) keys, finds and builds artifacts through this interface
 * alone: adding a compiler is one file in jit/ and one entry of
 * jit_compilers (jit/compilers.c). */

/* What a compiler compiles. */
enum {
    JIT_C = 1,          /* a .c source */
    JIT_CU_HOST = 2,    /* the host half of a .cu (C, #ifndef __CUDACC_RTC__) */
    JIT_CU_DEVICE = 4,  /* the device half of a .cu */
};

/* What the runtime was configured with, for every compiler (the loader
 * fills it from the runtime's settings, runtime/settings.h). */
/* (A field added here is copied in pipeline_init too.) */
typedef struct jit_settings {
    const char *cc_name;      /* the optimizing C compiler as configured ("cc", a path) */
    const char *path;         /* $PATH, to find it (NULL: the usual one) */
    char cc[PATH_MAX];        /* the optimizing C compiler, resolved (prepare); "" when none */
    long cc_timeout_ms;       /* then it is killed with everything it started */
    const char *cuda_archs;   /* "sm_80,sm_90,compute_90", resolved by the loader */
    const char *scratch;      /* a private directory for logs (may be NULL until needed) */
    const char *tmpdir;       /* where scratch goes ($TMPDIR; NULL: /tmp) */
    int cpu_level;            /* OPJIT_CPU_LEVEL: the highest x86-64 level (1-4) the
                                 optimizing tier builds for; 0: what the CPU has */
} jit_settings;

/* One compile: one source for one target. */
typedef struct jit_job {
    const char *source_name; /* for diagnostics: "ops-src/nms.c" */
    const char *text;        /* the source, as hashed into the key */
    size_t len;
    unsigned half;           /* JIT_C, JIT_CU_HOST or JIT_CU_DEVICE */
    int link_blas;           /* the source calls OpenBLAS */
    const char *const *include_dirs; /* the source's directory, opjit_op.h's; NULL-terminated */
    const char *target;      /* one of the compiler's targets */
    const char *dir;         /* the artifact is written into dir */
    const char *artifact;    /* under this name */
    const jit_settings *set;
} jit_job;

typedef struct jit_compiler {
    const char *name;     /* the tier its code serves ("tcc", "opt", "nvrtc"); a key field */
    const char *what;     /* for messages: "libtcc", "the optimizing C compiler", "NVRTC" */
    unsigned halves;      /* what it compiles: JIT_C | JIT_CU_HOST | JIT_CU_DEVICE */
    int background;       /* slow: a load uses its code when cached, never waits for it */
    /* Who the compiler is, cheaply (no process, no dlopen): a hash of its
     * file's path and stat; 0 when it is not on this machine. NULL when
     * the identity itself is cheap (then no index entries are kept). */
    int (*file_id)(const jit_settings *set, char *out, size_t n);
    /* What goes into the key: its version and where it lives. May run or
     * load the compiler; the loader keeps it for the runtime's life. */
    int (*identity)(const jit_settings *set, char *out, size_t n, char *err, size_t errlen);
    /* The options of job that change the artifact (flags, defines, the
     * libraries it links, headers outside the source's directory). */
    void (*options)(const jit_job *job, char *out, size_t n);
    /* Targets this machine needs, comma-separated, best first. A host
     * compiler's code for any of them runs here (the first is built); a
     * device compiler builds each. */
    void (*targets)(const jit_settings *set, char *out, size_t n);
    /* The artifact's file name for target ("host.so", "sm_90.cubin"). */
    void (*artifact)(const char *target, char *out, size_t n);
    /* Build job->artifact in job->dir. OPJIT_ECOMPILE with diagnostics
     * ("file:line: error: ..."), OPJIT_EDEVICE (compiler missing),
     * OPJIT_EIO, OPJIT_ENOMEM. */
    int (*compile)(const jit_job *job, char *diag, size_t n);

    /* The rest may be NULL. */
    /* Once per runtime, before the others: what it needs from set
     * resolved (a compiler found on PATH); 0 when it is not on this
     * machine (a background compiler then builds nothing). NULL: here. */
    int (*prepare)(jit_settings *set);
    /* Around a fork() whose child may compile (a lock the compiler holds
     * must not be taken in the child by a thread it does not have). */
    void (*fork_prepare)(void);
    void (*fork_done)(void);
    /* Device compilers: whether target names one of its targets; the
     * target for a device of capability cc ("sm_90", or what this
     * compiler can build for it instead); the target to try when target
     * cannot be compiled here (0: none); who built its artifacts, for
     * messages ("NVRTC 13.0"). */
    int (*target_valid)(const char *target);
    void (*device_target)(int cc, char *out, size_t n);
    int (*fallback_target)(const char *target, char *out, size_t n);
    void (*producer)(char *out, size_t n);
} jit_compiler;

extern const jit_compiler jit_tcc, jit_cc, jit_nvrtc;
/* Every compiler, NULL-terminated; for one half the better code first. */
extern const jit_compiler *const jit_compilers[];
/* The compiler a load of half waits for: the first of the table that
 * compiles it and is not a background one; NULL when none. */
const jit_compiler *jit_first(unsigned half);
/* Around a fork() whose child may compile: every compiler's fork hooks. */
void jit_fork_prepare(void);
void jit_fork_done(void);

/* "x86_64-linux": the machine's triple (once per process). */
const char *jit_host_target(void);
/* A hash of what identifies a compiler's file cheaply: its path and the
 * device, inode, size and modification time of the file it leads to, as
 * "prefix:<hex>" into out; 0 when it cannot be read. */
int jit_file_id(const char *prefix, const char *path, char *out, size_t n);
/* The same from a stat of path the caller made already. */
int jit_file_id_of(const char *prefix, const char *path, const struct stat *st, char *out,
                   size_t n);

/* What the host (C) compilers share: the include directories of a job
 * (the source's, CBLAS's and DLPack's, then the build's own, which holds
 * opjit_op.h alone; NULL-terminated in out, which has room for max; the
 * count), the directory of the OpenBLAS host code links,
 * the artifact's name ("host.so"), and a list of flags appended to out
 * (k bytes used) as " PREFIXv[0] PREFIXv[1]..." (the new length). */
int jit_host_includes(const jit_job *job, const char **out, int max);
void jit_blas_dir(char *out, size_t n);
void jit_host_artifact(const char *target, char *out, size_t n);
size_t jit_join(char *out, size_t n, size_t k, const char *prefix, const char *const *v);

/* A compiler's diagnostics as they are gathered: text appended to buf is
 * cut at cap - 1 bytes and stays NUL-terminated (cap 0: none is kept). */
typedef struct jit_diag {
    char *buf;
    size_t len, cap;
} jit_diag;
void jit_diag_put(jit_diag *d, const char *s, size_t n);

/* Make the shared object at path ask for a non-executable stack: add a
 * PT_GNU_STACK header (read, write) where it has none. An error, why in
 * diag, when it is not a whole 64-bit ELF shared object or asks for an
 * executable stack itself. */
int jit_elf_stack_noexec(const char *path, char *diag, size_t n);

/* ---- the compilers' own interfaces ---------------------------------------- */

typedef struct jit_tcc_job {
    const char *source_name; /* for diagnostics: "ops-src/nms.c" */
    const char *text;        /* the source, as hashed into the cache key */
    const char *const *include_dirs; /* NULL-terminated */
    const char *const *defines;      /* "NAME" or "NAME=VALUE", NULL-terminated */
    const char *const *libraries;    /* "openblas", "m"; NULL-terminated */
    const char *const *library_dirs; /* NULL-terminated, may be NULL */
    const char *tcc_lib_dir;         /* libtcc1.a and tcc's own headers */
    const char *out_path;            /* the shared object to write */
    /* Compiled ahead of text (jit/tcc_prelude.h), or NULL. */
    const char *prelude;
    size_t prelude_len;
} jit_tcc_job;

/* Compile job->text as C into a shared object at job->out_path. On failure
 * returns OPJIT_ECOMPILE (or OPJIT_EIO when the file cannot be written) and
 * puts the diagnostics into diag: "file:line: error: ..." followed by the
 * offending source line. libtcc is not reentrant: calls are serialised. */
int jit_tcc_compile(const jit_tcc_job *job, char *diag, size_t diaglen);
/* Names, each once (jit/tcc_stub.c). */
typedef struct jit_names {
    char **v;
    int n, cap;
} jit_names;
void jit_names_free(jit_names *n);
/* 0, or -1 out of memory. */
int jit_names_add(jit_names *n, const char *name, size_t len);
/* Add the names an ELF object (or each object of an ar archive) uses and
 * does not define. 0, or -1 when the file is not one that can be read
 * whole (an object's every section checked to lie in the file). */
int jit_object_undefined(const char *path, jit_names *out);
int jit_archive_undefined(const char *path, jit_names *out);
/* 1 when path is an ar archive. */
int jit_is_archive(const char *path);
/* The first dir/name, of the ':'-separated list dirs, that is a regular
 * file (as libtcc searches its paths), into out (n bytes); 0 when none. */
int jit_find_in(const char *dirs, const char *name, char *out, size_t n);
/* Stubs of the shared libraries libs (paths, in link order) and of those
 * they need (found on search, a ':'-separated list, as libtcc finds them),
 * in dir: each with the library's soname, needs and versions and only the
 * dynamic symbols named in want. Each name written is added to written
 * (to remove later); stub[i] is the file to link for libs[i]. 0, or -1
 * when a library cannot be stubbed (then link the real ones). */
int jit_tcc_stubs_write(const char *dir, const char *const *libs, int nlibs, const char *search,
                        const jit_names *want, jit_names *written, char (*stub)[PATH_MAX]);

/* How libtcc gets the C library (jit/tcc_link.c): the files libc.so's and
 * libm.so's linker scripts name, found once per process, where they can be
 * read; else libtcc's own search. With the files, the shared libraries
 * are linked as stubs when they can be (jit/tcc_stub.c). One per compile,
 * the phases in order. */
struct TCCState;
#define JIT_TCC_LINK_LIBS 8
typedef struct jit_tcc_link {
    int on;      /* the files are handed over */
    int stubbed; /* and the shared libraries as stubs in dir */
    char dir[PATH_MAX];
    jit_names written; /* the stubs in dir */
    /* each shared library of the link, and its stub */
    const char *real[JIT_TCC_LINK_LIBS];
    char stub[JIT_TCC_LINK_LIBS][PATH_MAX];
    char lib[JIT_TCC_LINK_LIBS][PATH_MAX]; /* -l libraries, found */
    const char *lname[JIT_TCC_LINK_LIBS];  /* their names; NULL for libm's, libc's */
    int nreal;
} jit_tcc_link;
/* "files" or "libtcc": what a compile with this lib dir does. */
const char *jit_tcc_link_mode(const char *tcc_lib_dir);
/* First: whether the files are handed over (k->on), for this lib dir. */
void jit_tcc_link_init(jit_tcc_link *k, const char *tcc_lib_dir);
/* Once the op is compiled to an object using the names in want (to which
 * the link's other files' are added): stubs in dir (the build's own
 * directory) for linking it with the libraries libs (found on libtcc's
 * library paths, then library_dirs), when they can be made. */
void jit_tcc_link_stubs(jit_tcc_link *k, jit_names *want, const char *dir,
                        const char *const *libs, const char *const *library_dirs);
/* The stubs removed. */
void jit_tcc_link_done(jit_tcc_link *k);
/* Before tcc_set_output_type: -nostdlib when the files are handed over,
 * the stubs' directory searched first. */
void jit_tcc_link_start(jit_tcc_link *k, struct TCCState *s);
/* After tcc_set_output_type: crti.o. */
void jit_tcc_link_crt(jit_tcc_link *k, struct TCCState *s);
/* -l name (libm's files for "m"). 0 or -1. */
int jit_tcc_link_library(jit_tcc_link *k, struct TCCState *s, const char *name);
/* After the libraries: libc's files, libtcc1.a, crtn.o. */
int jit_tcc_link_runtime(jit_tcc_link *k, struct TCCState *s);

/* Around a fork() whose child compiles: hold libtcc's lock so the child
 * never starts with it taken by a thread it does not have. */
void jit_tcc_fork_prepare(void);
void jit_tcc_fork_done(void);

/* ---- the optimizing C compiler (jit/cc.c): cc -O2 as a child process ------ */

typedef struct jit_cc_job {
    const char *cc;          /* the compiler (jit_cc_find) */
    const char *source_name; /* for diagnostics (#line) */
    const char *text;        /* the source */
    size_t len;
    const char *march;       /* "x86-64-v3", or NULL for the compiler's default */
    const char *const *defines;      /* "-DNAME", NULL-terminated */
    const char *const *include_dirs; /* NULL-terminated, at most 8 */
    const char *blas_dir;    /* link OpenBLAS from here, or NULL */
    const char *dir;         /* where it works; the artifact is dir/out_name */
    const char *out_name;
    long timeout_ms;         /* then killed with everything it started */
} jit_cc_job;

/* What `cc --version` prints (malloc'd, *len bytes), using scratch for
 * its log; NULL when it fails. */
char *jit_cc_version(const char *cc, const char *scratch, long timeout_ms, size_t *len);
/* Compile job->text with -O2 -fPIC -shared into dir/out_name. OPJIT_OK, or
 * OPJIT_ECOMPILE (failed, or killed at the time limit) / OPJIT_EIO with
 * diag saying why. */
int jit_cc_compile(const jit_cc_job *job, char *diag, size_t diaglen);

/* ---- NVRTC (jit/nvrtc.c): CUDA device code -> cubin or PTX ---------------- */

typedef struct jit_nvrtc_job {
    const char *source_name; /* NVRTC's program name: diagnostics say "name:line" */
    const char *text;        /* the whole .cu; NVRTC defines __CUDACC_RTC__ */
    const char *arch;        /* "sm_90": a cubin; "compute_90": PTX */
    const char *const *options; /* more NVRTC options, NULL-terminated, may be NULL */
    const char *out_path;    /* the file to write */
} jit_nvrtc_job;

/* Load libnvrtc (dlopen, once per process; a failure is retried next time):
 * $OPJIT_NVRTC_LIBRARY alone when set, else $CUDA_HOME, $CUDA_PATH,
 * /usr/local/cuda (lib64/, lib/), else the default library search, for
 * libnvrtc.so.13, .12, .11 and libnvrtc.so. OPJIT_EDEVICE with a message
 * saying what was tried when there is none. */
int jit_nvrtc_load(char *err, size_t errlen);
/* "nvrtc 13.0 libnvrtc.so.13 109338064": version, file and size, for cache
 * keys. NULL until loaded. */
const char *jit_nvrtc_identity(void);
/* The file jit_nvrtc_load would load first, found without loading it
 * (what a cache of its identity can be keyed by), and its stat in *st; 0
 * when only the default library search would find one. */
int jit_nvrtc_locate(char *path, size_t n, struct stat *st);
/* Where the library was found; NULL until loaded. */
const char *jit_nvrtc_path(void);
/* The options every compile gets besides -arch and include paths. */
const char *jit_nvrtc_options(void);
/* 1 if the loaded NVRTC compiles for architecture number (90 for sm_90). */
int jit_nvrtc_supports(int arch_number);
/* The highest architecture number <= at_most NVRTC compiles for; 0 if none
 * or unknown. */
int jit_nvrtc_highest_arch(int at_most);
/* Compile job->text for job->arch into job->out_path. OPJIT_ECOMPILE with
 * NVRTC's log in diag ("nms.cu:12: error: ..." and the line), OPJIT_EDEVICE
 * when NVRTC cannot be loaded, OPJIT_EINVAL for a bad arch, OPJIT_EIO. */
int jit_nvrtc_compile(const jit_nvrtc_job *job, char *diag, size_t diaglen);

/* "sm_90" -> 90, ptx 0; "compute_90" -> 90, ptx 1 ("sm_90a" too). 0 when
 * s is not an architecture name. */
int jit_cuda_arch_parse(const char *s, int *number, int *ptx);
/* The CUDA toolkit's include directory (holding cuda.h) under $CUDA_HOME,
 * $CUDA_PATH or /usr/local/cuda; 0 and "" when none. */
int jit_cuda_include_dir(char *out, size_t n);
/* dlopen the first of names found in a CUDA toolkit, searched as for
 * NVRTC (override: that path or soname alone). On success path receives
 * where; on failure NULL and err says what was tried. */
void *jit_cuda_dlopen(const char *const *names, const char *override, int flags, char *path,
                      size_t pathlen, char *err, size_t errlen);

#endif
