/* runtime/schema.c - PyTorch-style operator schemas, parsed once at
 * registration:
 *
 *   conv2d(Tensor input, Tensor weight, Tensor? bias=None,
 *          int[2] stride=1, int[2] padding=0, int groups=1) -> Tensor
 *
 * Types: Tensor, int, float, bool, int[N] (N <= OPJIT_MAX_LIST), str, each
 * optionally followed by '?' (may be None). A str default is quoted, as in
 * PyTorch's schemas: str padding="valid" (or 'valid'), no escapes. A bare
 * '*' (keyword-only marker) is accepted and ignored. A Tensor the kernel
 * writes in place says so as PyTorch does, Tensor(a!) self (frameworks
 * must know: torch functionalizes such ops); outputs are always new
 * tensors, so nothing else may alias. Returns: Tensor or (Tensor, ...),
 * with optional names. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

typedef struct parser {
    const char *text;
    const char *p;
    char *err;
    size_t errlen;
} parser;

static int fail(parser *ps, const char *what)
{
    if (!ps->text)
        snprintf(ps->err, ps->errlen, "bad schema (NULL): %s at column 1", what);
    else
        snprintf(ps->err, ps->errlen, "bad schema '%s': %s at column %d", ps->text, what,
                 (int)(ps->p - ps->text) + 1);
    return OPJIT_ESCHEMA;
}

static void skip_ws(parser *ps)
{
    while (isspace((unsigned char)*ps->p))
        ps->p++;
}

static int accept(parser *ps, char c)
{
    skip_ws(ps);
    if (*ps->p == c) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* Identifier (letters, digits, '_', and '.' for overload names). */
static char *ident(parser *ps, int allow_dot)
{
    skip_ws(ps);
    const char *s = ps->p;
    if (!isalpha((unsigned char)*s) && *s != '_')
        return NULL;
    while (isalnum((unsigned char)*ps->p) || *ps->p == '_' || (allow_dot && *ps->p == '.'))
        ps->p++;
    return strndup(s, (size_t)(ps->p - s));
}

static int parse_int(parser *ps, int64_t *out)
{
    skip_ws(ps);
    char *end;
    errno = 0;
    long long v = strtoll(ps->p, &end, 10);
    if (end == ps->p || errno)
        return 0;
    ps->p = end;
    *out = v;
    return 1;
}

/* Append str at *p, never past end (which stays free for the NUL). A
 * schema is parsed at every load: this is its hot path, no printf. */
static void put(char **p, const char *end, const char *str)
{
    size_t n = strlen(str), room = (size_t)(end - *p);
    n = n < room ? n : room;
    memcpy(*p, str, n);
    *p += n;
}

static int parse_type(parser *ps, schema_arg *a)
{
    char *t = ident(ps, 0);
    if (!t)
        return fail(ps, "expected a type");
    int rc = OPJIT_OK;
    if (!strcmp(t, "Tensor"))
        a->kind = OPJIT_KIND_TENSOR;
    else if (!strcmp(t, "int"))
        a->kind = OPJIT_KIND_INT;
    else if (!strcmp(t, "float"))
        a->kind = OPJIT_KIND_FLOAT;
    else if (!strcmp(t, "bool"))
        a->kind = OPJIT_KIND_BOOL;
    else if (!strcmp(t, "str"))
        a->kind = OPJIT_KIND_STR;
    else
        rc = fail(ps, "unknown type (expected Tensor, int, float, bool, str or int[N])");
    free(t);
    if (rc)
        return rc;
    if (*ps->p == '[') {
        ps->p++;
        int64_t n;
        if (a->kind != OPJIT_KIND_INT)
            return fail(ps, "only int lists are supported");
        if (!parse_int(ps, &n) || n < 1 || n > OPJIT_MAX_LIST)
            return fail(ps, "expected a list length from 1 to 8");
        if (!accept(ps, ']'))
            return fail(ps, "expected ']'");
        a->kind = OPJIT_KIND_INTS;
        a->list_len = (int)n;
    }
    if (*ps->p == '?') {
        ps->p++;
        a->optional = 1;
    }
    char buf[32], *p = buf;
    const char *end = buf + sizeof buf - 1;
    put(&p, end, a->kind == OPJIT_KIND_TENSOR ? "Tensor"
                 : a->kind == OPJIT_KIND_INT || a->kind == OPJIT_KIND_INTS ? "int"
                 : a->kind == OPJIT_KIND_FLOAT                             ? "float"
                 : a->kind == OPJIT_KIND_STR                               ? "str"
                                                                           : "bool");
    if (a->kind == OPJIT_KIND_INTS) { /* int[N], N from 1 to 8 */
        char len[4] = {'[', (char)('0' + a->list_len), ']', '\0'};
        put(&p, end, len);
    }
    put(&p, end, a->optional ? "?" : "");
    *p = '\0';
    a->type = strdup(buf);
    return OPJIT_OK;
}

static int word_is(parser *ps, const char *w)
{
    size_t n = strlen(w);
    if (strncmp(ps->p, w, n) || isalnum((unsigned char)ps->p[n]) || ps->p[n] == '_')
        return 0;
    ps->p += n;
    return 1;
}

/* A quoted str default, "..." or '...': no escapes, no newline. */
static int parse_str_default(parser *ps, schema_arg *a)
{
    char q = *ps->p;
    if (q != '"' && q != '\'')
        return fail(ps, "expected a quoted string default (\"...\")");
    const char *s = ++ps->p;
    while (*ps->p && *ps->p != q && *ps->p != '\\' && *ps->p != '\n')
        ps->p++;
    if (*ps->p != q)
        return fail(ps, *ps->p == '\\' ? "escapes are not supported in a string default"
                                       : "unterminated string default");
    a->def_str = strndup(s, (size_t)(ps->p - s));
    ps->p++;
    if (!a->def_str)
        return fail(ps, "out of memory");
    a->def.kind = OPJIT_KIND_STR;
    a->def.u.str = a->def_str;
    return OPJIT_OK;
}

static int parse_default(parser *ps, schema_arg *a)
{
    skip_ws(ps);
    const char *start = ps->p;
    a->has_default = 1;
    if (word_is(ps, "None")) {
        if (!a->optional)
            return fail(ps, "None is a default only for optional (?) types");
        a->def.kind = OPJIT_KIND_NONE;
    } else if (a->kind == OPJIT_KIND_BOOL) {
        if (word_is(ps, "True") || word_is(ps, "true"))
            a->def.u.b = 1;
        else if (word_is(ps, "False") || word_is(ps, "false"))
            a->def.u.b = 0;
        else
            return fail(ps, "expected True or False");
        a->def.kind = OPJIT_KIND_BOOL;
    } else if (a->kind == OPJIT_KIND_INT) {
        if (!parse_int(ps, &a->def.u.i))
            return fail(ps, "expected an integer default");
        a->def.kind = OPJIT_KIND_INT;
    } else if (a->kind == OPJIT_KIND_FLOAT) {
        char *end;
        errno = 0;
        a->def.u.f = strtod(ps->p, &end);
        if (end == ps->p || errno)
            return fail(ps, "expected a number default");
        ps->p = end;
        a->def.kind = OPJIT_KIND_FLOAT;
    } else if (a->kind == OPJIT_KIND_INTS) {
        int64_t v;
        if (accept(ps, '[')) {
            for (int i = 0; i < a->list_len; i++) {
                if (i && !accept(ps, ','))
                    return fail(ps, "expected ',' in list default");
                if (!parse_int(ps, &a->def_ints[i]))
                    return fail(ps, "expected an integer in list default");
            }
            if (!accept(ps, ']'))
                return fail(ps, "list default has the wrong length");
        } else if (parse_int(ps, &v)) {
            for (int i = 0; i < a->list_len; i++)
                a->def_ints[i] = v;
        } else {
            return fail(ps, "expected an integer or [list] default");
        }
        a->def.kind = OPJIT_KIND_INTS;
        a->def.len = a->list_len;
        a->def.u.ints = a->def_ints;
    } else if (a->kind == OPJIT_KIND_STR) {
        int rc = parse_str_default(ps, a);
        if (rc)
            return rc;
    } else {
        return fail(ps, "Tensor defaults can only be None");
    }
    skip_ws(ps);
    const char *end = ps->p;
    while (end > start && isspace((unsigned char)end[-1]))
        end--;
    a->default_text = strndup(start, (size_t)(end - start));
    return OPJIT_OK;
}

/* "-> Tensor" or "-> (Tensor [name], ...)", and the end of the text. */
static int parse_returns(parser *ps, schema *s)
{
    skip_ws(ps);
    if (strncmp(ps->p, "->", 2))
        return fail(ps, "expected '->'");
    ps->p += 2;
    int paren = accept(ps, '(');
    do {
        char *t = ident(ps, 0);
        int ok = t && !strcmp(t, "Tensor");
        free(t);
        if (!ok)
            return fail(ps, "outputs must be Tensor");
        if (*ps->p == '(')
            return fail(ps, "an output cannot alias an input: opjit outputs are new tensors");
        if (s->nouts == OPJIT_MAX_OUTS)
            return fail(ps, "too many outputs");
        s->nouts++;
        skip_ws(ps);
        if (paren && (isalpha((unsigned char)*ps->p) || *ps->p == '_'))
            s->out_names[s->nouts - 1] = ident(ps, 0); /* grad_<name> in a backward */
    } while (paren && accept(ps, ','));
    if (paren && !accept(ps, ')'))
        return fail(ps, "expected ')' after outputs");
    skip_ws(ps);
    if (*ps->p)
        return fail(ps, "unexpected text after the outputs");
    return OPJIT_OK;
}

static void canonicalize(schema *s)
{
    size_t cap = strlen(s->text) + 64 + (size_t)s->nargs * 64;
    char *c = malloc(cap), *p = c;
    if (!c)
        return;
    const char *end = c + cap - 1;
    put(&p, end, s->name);
    put(&p, end, "(");
    for (int i = 0; i < s->nargs; i++) {
        const schema_arg *a = &s->args[i];
        put(&p, end, i ? ", " : "");
        put(&p, end, a->type);
        if (a->alias) {
            put(&p, end, "(");
            put(&p, end, a->alias);
            put(&p, end, "!)");
        }
        put(&p, end, " ");
        put(&p, end, a->name);
        if (a->has_default) {
            put(&p, end, "=");
            put(&p, end, a->default_text);
        }
    }
    put(&p, end, ") -> ");
    for (int i = 0; i < s->nouts; i++) {
        put(&p, end, s->nouts == 1 ? "" : i ? ", " : "(");
        put(&p, end, "Tensor");
    }
    put(&p, end, s->nouts > 1 ? ")" : "");
    *p = '\0';
    s->canonical = c;
}

/* The operator's name, at most OPJIT_NAME_MAX characters. */
static int parse_name(parser *ps, schema *s)
{
    s->name = ident(ps, 1);
    if (!s->name)
        return fail(ps, "expected the operator name");
    if (strlen(s->name) > OPJIT_NAME_MAX) {
        char why[96];
        snprintf(why, sizeof why, "the operator name has %zu characters, more than %d",
                 strlen(s->name), OPJIT_NAME_MAX);
        return fail(ps, why);
    }
    return OPJIT_OK;
}

/* After a type: PyTorch's write annotation, Tensor(a!) or Tensor(a!)?. */
static int parse_alias(parser *ps, schema_arg *a)
{
    if (*ps->p != '(')
        return OPJIT_OK;
    ps->p++;
    if (a->kind != OPJIT_KIND_TENSOR || a->optional)
        return fail(ps, "only a Tensor can carry an alias annotation, as Tensor(a!) or "
                        "Tensor(a!)?");
    a->alias = ident(ps, 0);
    if (!a->alias)
        return fail(ps, "expected an alias set name, as in Tensor(a!)");
    if (!accept(ps, '!'))
        return fail(ps, "an alias annotation must say '!' (the kernel writes this input): "
                        "opjit outputs are new tensors, so none may alias an input");
    if (!accept(ps, ')'))
        return fail(ps, "expected ')' after the alias annotation");
    if (*ps->p == '?') {
        ps->p++;
        a->optional = 1;
        free(a->type);
        a->type = strdup("Tensor?");
    }
    return OPJIT_OK;
}

/* One argument, "type name[=default]", or the keyword-only marker '*'.
 * *seen_default: an earlier argument had a default (then this one must). */
static int parse_arg(parser *ps, schema *s, int *seen_default)
{
    skip_ws(ps);
    if (*ps->p == '*') { /* keyword-only marker */
        ps->p++;
        return OPJIT_OK;
    }
    if (s->nargs == OPJIT_MAX_ARGS)
        return fail(ps, "too many arguments");
    schema_arg *a = &s->args[s->nargs++];
    int rc = parse_type(ps, a);
    if (!rc)
        rc = parse_alias(ps, a);
    if (rc)
        return rc;
    a->name = ident(ps, 0);
    if (!a->name)
        return fail(ps, "expected an argument name");
    if (schema_arg_index(s, a->name) != s->nargs - 1)
        return fail(ps, "duplicate argument name");
    if (accept(ps, '=')) {
        if ((rc = parse_default(ps, a)))
            return rc;
        *seen_default = 1;
    } else if (*seen_default) {
        return fail(ps, "an argument without a default follows one with a default");
    }
    return OPJIT_OK;
}

/* "(arg, ...)" */
static int parse_args(parser *ps, schema *s)
{
    if (!accept(ps, '('))
        return fail(ps, "expected '('");
    if (accept(ps, ')'))
        return OPJIT_OK;
    int seen_default = 0;
    do {
        int rc = parse_arg(ps, s, &seen_default);
        if (rc)
            return rc;
    } while (accept(ps, ','));
    if (!accept(ps, ')'))
        return fail(ps, "expected ',' or ')'");
    return OPJIT_OK;
}

int schema_parse(const char *text, schema *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    parser ps = {text, text, err, errlen};
    if (!text)
        return fail(&ps, "no schema");
    s->text = strdup(text);
    int rc = parse_name(&ps, s);
    if (!rc)
        rc = parse_args(&ps, s);
    if (!rc)
        rc = parse_returns(&ps, s);
    if (!rc) {
        canonicalize(s);
        if (!s->canonical || !s->text) {
            snprintf(err, errlen, "out of memory parsing schema");
            rc = OPJIT_ENOMEM;
        }
    }
    if (rc)
        schema_free(s);
    return rc;
}

void schema_free(schema *s)
{
    for (int i = 0; i < s->nargs; i++) {
        free(s->args[i].name);
        free(s->args[i].type);
        free(s->args[i].default_text);
        free(s->args[i].def_str);
        free(s->args[i].alias);
    }
    for (int i = 0; i < s->nouts; i++)
        free(s->out_names[i]);
    free(s->text);
    free(s->canonical);
    free(s->name);
    memset(s, 0, sizeof *s);
}

int schema_arg_index(const schema *s, const char *name)
{
    for (int i = 0; i < s->nargs; i++)
        if (s->args[i].name && !strcmp(s->args[i].name, name))
            return i;
    return -1;
}
