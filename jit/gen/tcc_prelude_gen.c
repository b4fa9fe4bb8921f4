/*
 * jit/gen/tcc_prelude_gen.c - at build time, <opjit_op.h> preprocessed
 * by libtcc as an op's compile would include it, written as C for the
 * library (jit/tcc_prelude.c uses it).
 *
 *   tcc_prelude_gen OUT.c OPJIT_INCLUDE_DIR
 *
 * The text is libtcc's -E -dD output: the declarations with every macro
 * defined (and undefined) on the way, in order, and line markers. Compiled
 * ahead of an op whose first directive is #include <opjit_op.h>, it leaves
 * libtcc in the state that include would, without opening, searching and
 * preprocessing some twenty glibc, DLPack and tcc headers (about a ninth of
 * a cold compile of nms.c) A second one stands for <opjit_op.h> then
 * <math.h>, which most ops include next and which costs libtcc more than
 * the rest of a small op (its declarations come from one header included
 * once per floating type). Beside it: the system headers it holds, with
 * their sizes and modification times, and the names they were included by,
 * for the runtime to check that the same headers would be found.
 *
 * libtcc prints two things of a macro wrongly: "##" as its internal token
 * ("<a6>"), and "..." as __VA_ARGS__; both are put back, and then
 * every #define must read as in the header it comes from (blanks and
 * comments aside), or there is no prelude.
 *
 * Anything unexpected writes an empty prelude (the library then compiles
 * as without one) and says why on stderr; the build goes on.
 */

#include <libtcc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit_build_config.h"
#include "jit/tcc_defines.h"
#include "jit/tcc_prelude.h"

#define MAX_FILES 128

typedef struct header {
    char path[4096];
    long long size, mtime_sec, mtime_nsec;
} header;

/* What the run gathers beside the text. */
typedef struct found {
    const char *order[10];      /* search_order() */
    const char *opjit_inc;
    header h[MAX_FILES];        /* the system headers */
    char names[MAX_FILES][256]; /* first parts of the names they were included by */
    char absent[4 * MAX_FILES][4096];
    int nh, nn, na;
} found;

static const char *const defines[] = {JIT_TCC_DEFINES, NULL};

/* The leading includes each prelude stands for. */
static const char *const sequences[][JIT_PRELUDE_MAX_INCLUDES] = {
    {"opjit_op.h", NULL},
    {"opjit_op.h", "math.h", NULL},
};
#define NSEQ ((int)(sizeof sequences / sizeof sequences[0]))

/* libtcc preprocesses to stdout: pointed at tmp for the call. The text
 * is the includes of seq, in order. */
static int preprocess(const char *tmp, const char *opjit_inc, const char *const *seq)
{
    fflush(stdout);
    if (!freopen(tmp, "w", stdout))
        return -1;
    TCCState *s = tcc_new();
    if (!s)
        return -1;
    tcc_set_lib_path(s, OPJIT_TCC_LIB_DIR);
    tcc_set_output_type(s, TCC_OUTPUT_PREPROCESS);
    tcc_set_options(s, "-dD");
    /* As jit_host_includes orders them for an op: the system directories,
     * then the one holding opjit_op.h. */
    tcc_add_include_path(s, OPJIT_CBLAS_INCLUDE_DIR);
    tcc_add_include_path(s, OPJIT_DLPACK_INCLUDE_DIR);
    tcc_add_include_path(s, opjit_inc);
    for (const char *const *d = defines; *d; d++)
        tcc_define_symbol(s, *d, NULL);
    char text[512];
    size_t k = 0;
    for (int i = 0; i < JIT_PRELUDE_MAX_INCLUDES && seq[i] && k < sizeof text; i++)
        k += (size_t)snprintf(text + k, sizeof text - k, "#include <%s>\n", seq[i]);
    int rc = tcc_compile_string(s, text);
    fflush(stdout);
    tcc_delete(s);
    return rc;
}

/* A line marker's file name ("# N \"file\" ..."), or NULL. */
static const char *marker_file(const char *line, char *out, size_t n)
{
    if (line[0] != '#' || line[1] != ' ' || line[2] < '0' || line[2] > '9')
        return NULL;
    const char *q = strchr(line, '"'), *e = q ? strchr(q + 1, '"') : NULL;
    if (!e || (size_t)(e - q - 1) >= n)
        return NULL;
    memcpy(out, q + 1, (size_t)(e - q - 1));
    out[e - q - 1] = '\0';
    return out;
}

/* Where libtcc looks for <name>, in order: the include paths given in
 * preprocess(), then its own (tcc -vv). NULL-ended. */
static void search_order(const char *opjit_inc, const char *tcc_inc, const char *out[10])
{
    const char *dirs[] = {OPJIT_CBLAS_INCLUDE_DIR, OPJIT_DLPACK_INCLUDE_DIR, opjit_inc, tcc_inc,
                          "/usr/local/include/x86_64-linux-gnu", "/usr/local/include",
                          "/usr/include/x86_64-linux-gnu", "/usr/include", NULL};
    memcpy(out, dirs, sizeof dirs);
}

/* The index in order of the directory a header was found in: the longest
 * that holds path. -1 when none does. */
static int found_in(const char *path, const char *const *order)
{
    int best = -1;
    for (int i = 0; order[i]; i++) {
        size_t n = strlen(order[i]);
        if (!strncmp(path, order[i], n) && path[n] == '/' &&
            (best < 0 || n > strlen(order[best])))
            best = i;
    }
    return best;
}

/* s with comments dropped, each run of blanks one space, none next to
 * "##", "(", ")" or ",": how two spellings of a define compare. */
static void squeeze(const char *s, char *out, size_t n)
{
    size_t k = 0;
    int blank = 0;
    while (*s && k + 2 < n) {
        if (s[0] == '/' && s[1] == '*') {
            const char *e = strstr(s + 2, "*/");
            s = e ? e + 2 : s + strlen(s);
            blank = 1;
        } else if (s[0] == '/' && s[1] == '/') {
            break;
        } else if (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\\') {
            blank = 1, s++;
        } else {
            int tight = strchr("#(),", *s) || (k && strchr("#(,", out[k - 1]));
            if (blank && k && !tight)
                out[k++] = ' ';
            blank = 0;
            out[k++] = *s++;
        }
    }
    out[k] = '\0';
}

/* The define in line ("#define NAME..." as libtcc printed it, repaired)
 * is one of file's definitions of NAME. */
static int defined_so(const char *line, const char *file)
{
    const char *name = line + 8;
    size_t nl = strcspn(name, "( \t\n");
    FILE *f = fopen(file, "r");
    if (!f)
        return 0;
    static char text[1 << 20], want[8192], got[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    squeeze(name, want, sizeof want);
    int found = 0;
    for (char *p = text; !found && (p = strstr(p, "define")); p += 6) {
        /* "# define NAME" at the start of a line, blanks between. */
        char *q = p;
        while (q > text && (q[-1] == ' ' || q[-1] == '\t'))
            q--;
        if (q == text || q[-1] != '#')
            continue;
        for (q--; q > text && (q[-1] == ' ' || q[-1] == '\t');)
            q--;
        if (q > text && q[-1] != '\n')
            continue;
        char *d = p + 6;
        while (*d == ' ' || *d == '\t')
            d++;
        if (strncmp(d, name, nl) || (d[nl] != '(' && d[nl] != ' ' && d[nl] != '\t' &&
                                     d[nl] != '\n'))
            continue;
        /* The definition, its continued lines joined. */
        char def[8192];
        size_t k = 0;
        for (char *c = d; *c && k + 1 < sizeof def; c++) {
            if (*c == '\\' && c[1] == '\n') {
                c++;
                def[k++] = ' ';
                continue;
            }
            if (*c == '\n')
                break;
            def[k++] = *c;
        }
        def[k] = '\0';
        squeeze(def, got, sizeof got);
        found = !strcmp(want, got);
    }
    return found;
}

/* libtcc's -dD spelling of a define put right in place: "<a6>" (its
 * internal token's code) is "##", __VA_ARGS__ as the last parameter is
 * "...". 0 when it holds a byte past ASCII. */
static int repair_define(char *line)
{
    for (char *c = line; *c; c++)
        if ((unsigned char)*c >= 0x80)
            return 0;
    for (char *c; (c = strstr(line, "<a6>"));) {
        c[0] = c[1] = '#';
        memmove(c + 2, c + 4, strlen(c + 4) + 1);
    }
    char *open = line + 8 + strcspn(line + 8, "( \t\n");
    char *va = *open == '(' ? strstr(open, "__VA_ARGS__)") : NULL;
    if (va && va < strchr(open, ')') + 1 && (va[-1] == '(' || va[-1] == ',')) {
        memcpy(va, "...", 3);
        memmove(va + 3, va + 11, strlen(va + 11) + 1);
    }
    return 1;
}

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        fprintf(f, (*s == '"' || *s == '\\') ? "\\%c" : "%c", *s);
    fputc('"', f);
}

/* The prelude in out: text (len bytes) and its headers, or empty. */
/* The preludes made (text[v], len[v] bytes, for sequences[v]; none where
 * len[v] is 0) and what fd gathered, as C into out. */
static int write_c(const char *out, char *const *text, const size_t *len, const found *fd)
{
    FILE *f = fopen(out, "w");
    if (!f)
        return -1;
    fprintf(f, "/* Generated by jit/gen/tcc_prelude_gen.c at build time: do not edit. */\n"
               "#include \"jit/tcc_prelude.h\"\n");
    for (int v = 0; v < NSEQ; v++) {
        if (!len[v])
            continue;
        fprintf(f, "\nstatic const unsigned char text_%d[] = {", v);
        for (size_t i = 0; i < len[v]; i++)
            fprintf(f, "%s%u,", i % 24 ? "" : "\n", (unsigned char)text[v][i]);
        fprintf(f, "0};\n");
    }
    fprintf(f, "\nconst jit_prelude jit_tcc_preludes[] = {\n");
    for (int v = 0; v < NSEQ; v++) {
        if (!len[v])
            continue;
        fprintf(f, "    {{");
        for (int i = 0; i < JIT_PRELUDE_MAX_INCLUDES && sequences[v][i]; i++) {
            put_string(f, sequences[v][i]);
            fprintf(f, ", ");
        }
        fprintf(f, "0}, text_%d, %zu},\n", v, len[v]);
    }
    fprintf(f, "    {{0}, 0, 0},\n};\n\nconst jit_prelude_header jit_tcc_prelude_headers[] = {\n");
    for (int i = 0; i < fd->nh; i++) {
        const header *h = &fd->h[i];
        fprintf(f, "    {");
        put_string(f, h->path);
        fprintf(f, ", %lld, %lld, %lld},\n", h->size, h->mtime_sec, h->mtime_nsec);
    }
    fprintf(f, "    {0, 0, 0, 0},\n};\n\nconst char *const jit_tcc_prelude_names[] = {\n");
    for (int i = 0; i < fd->nn; i++) {
        fprintf(f, "    ");
        put_string(f, fd->names[i]);
        fprintf(f, ",\n");
    }
    fprintf(f, "    0,\n};\n\nconst char *const jit_tcc_prelude_absent[] = {\n");
    for (int i = 0; i < fd->na; i++) {
        fprintf(f, "    ");
        put_string(f, fd->absent[i]);
        fprintf(f, ",\n");
    }
    fprintf(f, "    0,\n};\n");
    return fclose(f);
}

static int fail(const char *out, const char *why)
{
    static const found none;
    static char *const no_text[NSEQ];
    static const size_t no_len[NSEQ];
    fprintf(stderr, "tcc_prelude_gen: %s: ops compile without a prelude\n", why);
    return write_c(out, no_text, no_len, &none) ? 1 : 0;
}

/* A header entered (path, found in fd->order[at]): its size and time,
 * the paths searched before it that must stay empty, the first part of
 * its name. NULL, or why it cannot be used. */
static const char *note_header(found *fd, const char *path, int at)
{
    const char *dir = fd->order[at], *name = path + strlen(dir) + 1;
    size_t k = strcspn(name, "/");
    int seen = 0;
    for (int i = 0; i < fd->nn; i++)
        seen |= strlen(fd->names[i]) == k && !strncmp(fd->names[i], name, k);
    if (!seen && fd->nn < MAX_FILES && k < sizeof fd->names[0])
        snprintf(fd->names[fd->nn++], sizeof fd->names[0], "%.*s", (int)k, name);
    /* opjit_op.h is the library's own bytes: the runtime checks its copy
     * apart. */
    if (dir == fd->opjit_inc)
        return NULL;
    for (int i = 0; i < fd->nh; i++)
        if (!strcmp(fd->h[i].path, path))
            return NULL;
    struct stat st;
    if (fd->nh == MAX_FILES || stat(path, &st) != 0)
        return "too many headers, or one that cannot be read";
    header *h = &fd->h[fd->nh++];
    snprintf(h->path, sizeof h->path, "%s", path);
    h->size = (long long)st.st_size;
    h->mtime_sec = (long long)st.st_mtim.tv_sec;
    h->mtime_nsec = (long long)st.st_mtim.tv_nsec;
    /* Found there because the directories searched before it lack it:
     * they must still (opjit_op.h's is the runtime's to check). */
    for (int j = 0; j < at; j++) {
        if (fd->order[j] == fd->opjit_inc || !strcmp(fd->order[j], dir))
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", fd->order[j], name);
        seen = 0;
        for (int i = 0; i < fd->na; i++)
            seen |= !strcmp(fd->absent[i], p);
        if (!seen && fd->na == 4 * MAX_FILES)
            return "too many places to check";
        if (!seen)
            snprintf(fd->absent[fd->na++], sizeof fd->absent[0], "%s", p);
    }
    return NULL;
}

/* libtcc's output (in), the headers' lines only (not tcc's predefined
 * macros and ours, which every state has, nor the string's own lines),
 * defines repaired, into *text (*len bytes, NUL-ended); fd learns the
 * headers. NULL, or why there is no prelude. */
static const char *gather(FILE *in, found *fd, char **text, size_t *len)
{
    size_t cap = 1 << 16, linecap = 0;
    char *line = NULL, file[4096], current[4096] = "";
    ssize_t n;
    const char *why = NULL;
    int keep = 0;
    *len = 0;
    *text = malloc(cap);
    while (!why && *text && (n = getline(&line, &linecap, in)) > 0) {
        const char *m = marker_file(line, file, sizeof file);
        if (m)
            keep = m[0] == '/';
        if (!keep)
            continue;
        if (m) {
            int at = found_in(m, fd->order);
            why = at < 0 ? "a header outside the known include directories"
                         : note_header(fd, m, at);
            snprintf(current, sizeof current, "%s", m);
        }
        if (!why && !strncmp(line, "#define ", 8)) {
            if (!repair_define(line) || !defined_so(line, current)) {
                fprintf(stderr, "tcc_prelude_gen: %s: %s", current, line);
                why = "a define libtcc did not print as its header has it";
            }
            n = (ssize_t)strlen(line);
        }
        if (*len + (size_t)n + 1 > cap) {
            char *t = realloc(*text, cap *= 2);
            if (!t)
                free(*text);
            *text = t;
            if (!t)
                break;
        }
        memcpy(*text + *len, line, (size_t)n);
        *len += (size_t)n;
    }
    free(line);
    if (!*text)
        return "out of memory";
    (*text)[*len] = '\0';
    return why ? why : !*len || !fd->nh ? "no header in libtcc's output" : NULL;
}

/* The prelude of seq into *text (*len bytes); fd learns its headers.
 * NULL, or why there is none. */
static const char *one_prelude(const char *tmp, const char *const *seq, found *fd, char **text,
                               size_t *len)
{
    int saved = dup(1);
    int rc = preprocess(tmp, fd->opjit_inc, seq);
    if (saved >= 0) { /* stdout back where it was */
        dup2(saved, 1);
        close(saved);
    }
    FILE *in = fopen(tmp, "r");
    const char *why = rc || !in ? "libtcc could not preprocess the headers" : NULL;
    if (!why)
        why = gather(in, fd, text, len);
    if (in)
        fclose(in);
    unlink(tmp);
    return why;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tcc_prelude_gen OUT.c OPJIT_INCLUDE_DIR\n");
        return 2;
    }
    const char *out = argv[1], *opjit_inc = argv[2];
    char tmp[4096], tcc_inc[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.i", out, (int)getpid());
    snprintf(tcc_inc, sizeof tcc_inc, "%s/include", OPJIT_TCC_LIB_DIR);
    static found fd;
    fd.opjit_inc = opjit_inc;
    search_order(opjit_inc, tcc_inc, fd.order);
    char *text[NSEQ] = {0};
    size_t len[NSEQ] = {0};
    for (int v = 0; v < NSEQ; v++) {
        const char *why = one_prelude(tmp, sequences[v], &fd, &text[v], &len[v]);
        if (why && v == 0) { /* the others extend the first */
            free(text[0]);
            return fail(out, why);
        }
        if (why) {
            fprintf(stderr, "tcc_prelude_gen: <%s> then <%s>: %s: no prelude for them\n",
                    sequences[v][0], sequences[v][1], why);
            free(text[v]);
            text[v] = NULL, len[v] = 0;
        }
    }
    int rc = write_c(out, text, len, &fd);
    for (int v = 0; v < NSEQ; v++)
        free(text[v]);
    if (rc) {
        fprintf(stderr, "tcc_prelude_gen: cannot write %s\n", out);
        return 1;
    }
    return 0;
}
