/* loader/confine.c - the rule an inline source's local headers follow
 * (loader/inline.c says why): checked by source.c for each include while
 * it reads the headers, so it sits below both. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader_int.h"

enum { REFUSE_NONE, REFUSE_ABSOLUTE, REFUSE_NO_DIR, REFUSE_NOT_IN_DIR, REFUSE_OUTSIDE,
       REFUSE_SHADOWED };

/* "scale2.c:3: " for an include of the source itself, "scale2.c: a header's " else. */
static int where(char *out, size_t n, const source_confine *c, const char *text, const char *at,
                 int depth)
{
    if (depth > 0)
        return snprintf(out, n, "%s: a header's ", c->name);
    int line = 1;
    for (const char *p = text; p < at; p++)
        line += *p == '\n';
    return snprintf(out, n, "%s:%d: ", c->name, line);
}

static int under(const char *dir, const char *real)
{
    size_t n = strlen(dir);
    return n && !strncmp(real, dir, n) && (real[n] == '/' || (n == 1 && dir[0] == '/'));
}

/* The compiler reads a quoted include of the text itself from the current
 * directory first: one there that is not the header the key hashed would
 * be compiled in its place. */
static int shadowed(const char *name, const char *real)
{
    char here[PATH_MAX];
    return realpath(name, here) && strcmp(here, real) != 0;
}

int source_confine_check(const source_confine *c, source_refusal *r, const char *text,
                         const char *at, int depth, int quoted, int found, const char *name,
                         const char *real)
{
    int kind = REFUSE_NONE;
    if (name[0] == '/')
        kind = REFUSE_ABSOLUTE;
    else if (found && !under(c->dir, real))
        kind = c->dir[0] ? REFUSE_OUTSIDE : REFUSE_NO_DIR;
    else if (depth == 0 && quoted && !found)
        kind = c->dir[0] ? REFUSE_NOT_IN_DIR : REFUSE_NO_DIR;
    else if (depth == 0 && quoted && shadowed(name, real))
        kind = REFUSE_SHADOWED;
    if (kind == REFUSE_NONE)
        return 0;
    char o = quoted ? '"' : '<', e = quoted ? '"' : '>';
    size_t k = (size_t)where(r->msg, sizeof r->msg, c, text, at, depth);
    k = k < sizeof r->msg ? k : sizeof r->msg - 1;
    char *m = r->msg + k;
    size_t n = sizeof r->msg - k;
    switch (kind) {
    case REFUSE_ABSOLUTE:
        snprintf(m, n, "#include %c%s%c: an inline source includes headers by relative path "
                 "only", o, name, e);
        break;
    case REFUSE_NO_DIR:
        snprintf(m, n, "#include %c%s%c: no include directory was given, so this inline "
                 "source has no local headers (name a directory, or write <...> for "
                 "opjit_op.h and system headers)", o, name, e);
        break;
    case REFUSE_NOT_IN_DIR:
        snprintf(m, n, "#include \"%s\": no such header in the include directory %s (write "
                 "<...> for opjit_op.h and system headers)", name, c->dir);
        break;
    case REFUSE_OUTSIDE:
        snprintf(m, n, "#include %c%s%c resolves to %s, outside the include directory %s", o,
                 name, e, real, c->dir);
        break;
    default:
        snprintf(m, n, "#include \"%s\": the current directory holds another %s, which the "
                 "compiler would read first; rename one of them or write <%s>", name, name,
                 name);
    }
    r->kind = kind;
    return 1;
}
