/* tests/test_index_note.c - the op index's note (loader/index_note.c):
 * written sorted, every source, op and header found again by binary
 * search among thousands; and a note cut, flipped or garbled is refused
 * or searched without reading out of bounds (run it under ASan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/index_int.h"
#include "opjit.h"
#include "t.h"

#define N 3000

typedef struct found {
    char files[8][64];
    int n;
} found;

static int took(void *ud, const char *file, size_t len)
{
    found *f = ud;
    if (f->n < 8 && len < 64) {
        memcpy(f->files[f->n], file, len);
        f->files[f->n++][len] = '\0';
    }
    return 0;
}

/* Sources src_0000.c .. (sorted), each registering op_<i> and shared_<i/2>,
 * every tenth failing; headers h0.h, h1.h shared by turns. */
static char *make_note(int cuda)
{
    idx_src *v = calloc(N, sizeof *v);
    idx_hdrs h = {0};
    file_sig g = {1, 2, 3, 4, 5};
    CHECK(hdrs_add(&h, "/x/h0.h", &g) == 0);
    g.ino = 99;
    CHECK(hdrs_add(&h, "/elsewhere/h1.h", &g) == 1);
    CHECK(hdrs_find(&h, "/elsewhere/h1.h") == 1 && hdrs_find(&h, "/nope.h") == -1);
    char name[64];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "src_%04d.c", i);
        v[i].file = strdup(name);
        v[i].sig = (file_sig){7, (unsigned long long)i, 10, 1000 + i, 2000 + i};
        v[i].status = i % 10 == 9 ? OPJIT_EMODULE : OPJIT_OK;
        src_set_msg(&v[i], v[i].status ? "it\tcrashed\n(signal 11)" : "");
        snprintf(name, sizeof name, "op_%d", i);
        src_add_op(&v[i], name, strlen(name));
        snprintf(name, sizeof name, "shared_%d", i / 2);
        src_add_op(&v[i], name, strlen(name));
        src_add_hdr(&v[i], i % 2);
    }
    char *text = note_text(v, N, &h, cuda, 0);
    for (int i = 0; i < N; i++)
        src_free(&v[i]);
    free(v);
    hdrs_free(&h);
    return text;
}

static void test_round_trip(void)
{
    char *text = make_note(1);
    idx_note n;
    CHECK(text && note_open(&n, text, strlen(text)) == 0);
    if (!text)
        return;
    CHECK(n.nsrc == N && n.nhdr == 2 && n.cuda == 1);
    idx_ent e;
    CHECK(note_src(&n, "src_1234.c", 10, &e) && e.sig.ino == 1234 && e.sig.mtime == 2234);
    CHECK(e.status == OPJIT_OK && ent_defines(&e, "op_1234") && ent_defines(&e, "shared_617"));
    CHECK(!ent_defines(&e, "op_123") && !ent_defines(&e, "shared_61"));
    CHECK(note_src(&n, "src_0009.c", 10, &e) && e.status == OPJIT_EMODULE);
    CHECK(e.msg_len && !memchr(e.msg, '\t', e.msg_len) && !ent_defines(&e, "op_9"));
    CHECK(!note_src(&n, "src_1234", 8, &e) && !note_src(&n, "src_1234.cu", 11, &e));
    CHECK(!note_src(&n, "a.c", 3, &e) && !note_src(&n, "zz.c", 4, &e));
    found f = {.n = 0};
    note_each_definer(&n, "shared_617", took, &f);
    CHECK(f.n == 2 && !strcmp(f.files[0], "src_1234.c") && !strcmp(f.files[1], "src_1235.c"));
    f.n = 0;
    note_each_definer(&n, "op_9", took, &f); /* its source failed: no op */
    CHECK(f.n == 0);
    note_each_definer(&n, "op_", took, &f);
    note_each_definer(&n, "op_29999", took, &f);
    CHECK(f.n == 0);
    const char *real;
    size_t len;
    file_sig g;
    CHECK(note_hdr(&n, 1, &real, &len, &g) && len == 15 && !memcmp(real, "/elsewhere/h1.h", 15) &&
          g.ino == 99);
    CHECK(!note_hdr(&n, 2, &real, &len, &g) && !note_hdr(&n, -1, &real, &len, &g));
    int count = 0;
    for (const char *at = NULL; note_next_src(&n, &at, &e);)
        count++;
    CHECK(count == N);
    idx_src s;
    CHECK(note_src(&n, "src_0042.c", 10, &e) && ent_to_src(&e, &s) == 0 && s.nops == 2 &&
          !strcmp(s.ops[1], "shared_21"));
    src_free(&s);
    note_close(&n);
}

static void test_garbled(void)
{
    char *good = make_note(-1);
    size_t len = good ? strlen(good) : 0;
    srand(20);
    int opened = 0;
    for (int round = 0; good && round < 400; round++) {
        size_t cut = round % 4 == 0 ? (size_t)rand() % len : len;
        char *t = malloc(len + 1);
        memcpy(t, good, len + 1);
        t[cut] = '\0';
        for (int k = round % 4 ? 1 + rand() % 8 : 0; k > 0; k--)
            t[(size_t)rand() % cut] = "\t\n0a9 .-"[rand() % 8];
        idx_note n;
        if (note_open(&n, t, strlen(t)) != 0)
            continue; /* refused: freed */
        opened++;
        idx_ent e;
        found f = {.n = 0};
        char name[32];
        for (int q = 0; q < 20; q++) {
            snprintf(name, sizeof name, "src_%04d.c", rand() % N);
            note_src(&n, name, strlen(name), &e);
            snprintf(name, sizeof name, "op_%d", rand() % N);
            note_each_definer(&n, name, took, &f);
        }
        const char *real;
        size_t rl;
        file_sig g;
        note_hdr(&n, 0, &real, &rl, &g);
        for (const char *at = NULL; note_next_src(&n, &at, &e);)
            ;
        note_close(&n);
    }
    CHECKF(opened > 0, "no garbled note was searched");
    free(good);
}

/* A source's record: schemas and docs with tabs, newlines and '\\', the
 * whole message, the time limit; a record whose ops do not match its
 * def lines, or garbled, is refused. */
static void test_record(void)
{
    idx_src v = {.status = OPJIT_OK, .limit_ms = 0};
    CHECK((v.file = strdup("m.c")) && src_set_msg(&v, "") == 0);
    CHECK(src_add_def(&v, "a(Tensor x) -> Tensor", "tab\there\nnew line \\ slash", 1) == 0);
    CHECK(src_add_def(&v, "b_op(int k=1) -> Tensor", "", 1) == 0);
    CHECK(src_add_def(&v, "(no name)", "skipped", 1) == 0 && v.nops == 2);
    char *text = note_text(&v, 1, NULL, -1, 1);
    idx_note n;
    idx_src r;
    CHECK(text && note_open(&n, text, strlen(text)) == 0);
    CHECK(note_record(&n, &r) == 0 && r.status == OPJIT_OK && r.nops == 2 && !r.detail &&
          !r.limit_ms);
    CHECK(!strcmp(r.ops[0], "a") && !strcmp(r.ops[1], "b_op"));
    CHECK(!strcmp(r.schemas[1], "b_op(int k=1) -> Tensor") && !strcmp(r.docs[1], ""));
    CHECK(!strcmp(r.docs[0], "tab\there\nnew line \\ slash"));
    idx_ent e; /* the index reads the same note */
    CHECK(note_src(&n, "m.c", 3, &e) && ent_defines(&e, "b_op") && !ent_defines(&e, "b"));
    src_free(&r);
    note_close(&n);

    /* A failure: its whole message, and the limit it ran out of. */
    src_free(&v);
    v = (idx_src){.status = OPJIT_EMODULE, .limit_ms = 1500};
    CHECK((v.file = strdup("m.c")) && src_set_msg(&v, "line one\nline two") == 0);
    CHECK((v.detail = strdup("line one\n\tline two")) != NULL);
    text = note_text(&v, 1, NULL, -1, 1);
    CHECK(text && note_open(&n, text, strlen(text)) == 0);
    CHECK(note_record(&n, &r) == 0 && r.status == OPJIT_EMODULE && r.nops == 0 &&
          r.limit_ms == 1500 && r.detail && !strcmp(r.detail, "line one\n\tline two"));
    src_free(&r);
    note_close(&n);

    /* Its ops named in the source line but no def line: refused. */
    src_free(&v);
    v = (idx_src){.status = OPJIT_OK};
    CHECK((v.file = strdup("m.c")) && src_set_msg(&v, "") == 0);
    CHECK(src_add_def(&v, "a(Tensor x) -> Tensor", "", 0) == 0 && !v.schemas);
    text = note_text(&v, 1, NULL, -1, 1);
    CHECK(text && note_open(&n, text, strlen(text)) == 0);
    CHECK(note_record(&n, &r) == -1);
    note_close(&n);
    src_free(&v);

    /* Cut or garbled anywhere: refused or read in bounds (ASan). */
    v = (idx_src){.status = OPJIT_OK};
    CHECK((v.file = strdup("m.c")) && src_set_msg(&v, "") == 0);
    CHECK(src_add_def(&v, "a(Tensor x) -> Tensor", "d\\t", 1) == 0);
    CHECK(src_add_def(&v, "b(Tensor x) -> Tensor", "e", 1) == 0);
    char *good = note_text(&v, 1, NULL, -1, 1);
    src_free(&v);
    size_t len = good ? strlen(good) : 0;
    srand(23);
    for (int round = 0; good && round < 2000; round++) {
        char *t = malloc(len + 1);
        memcpy(t, good, len + 1);
        size_t cut = round % 3 == 0 ? (size_t)rand() % len : len;
        t[cut] = '\0';
        for (int k = round % 3 ? 1 + rand() % 4 : 0; k > 0; k--)
            t[(size_t)rand() % cut] = "\t\n\\a(0 "[rand() % 7];
        if (note_open(&n, t, strlen(t)) != 0)
            continue;
        if (note_record(&n, &r) == 0) {
            CHECK(r.nops >= 0 && r.nops <= 2);
            for (int i = 0; i < r.nops; i++)
                CHECK(r.schemas[i] && r.docs[i] && r.ops[i]);
            src_free(&r);
        }
        note_close(&n);
    }
    free(good);
}

int main(void)
{
    T_RUN(test_round_trip);
    T_RUN(test_garbled);
    T_RUN(test_record);
    return t_done();
}
