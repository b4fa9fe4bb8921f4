/* tests/test_discover.c - a listing (opjit_discover) runs each version of a
 * source once (issue 23): what a child found is kept as the source's
 * record, and a warm listing reports it with no process and no op code
 * run, counted by the marks each init writes. An edited source or local
 * header is looked at again; statuses (a crash, an exit, a compile error,
 * a time limit run out of) are kept, a timeout with its limit; the op
 * index and the listing share the records both ways. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opjit.h"
#include "opjit_admin.h"
#include "t.h"
#include "t_files.h"
#include "t_index.h"

static const char *marks; /* the file each init appends its name to */

/* How many inits ran so far: the lines of the marks file. */
static int count_marks(void) { return t_lines(marks); }

/* A module whose init marks, then does what (registers, crashes, ...). */
static void write_module(const char *dir, const char *file, const char *pre, const char *what)
{
    char text[4096];
    snprintf(text, sizeof text,
             "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
             "#include <opjit_op.h>\n%s\n"
             "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
             "OPJIT_MODULE(mod, m)\n{\n"
             "    FILE *f = fopen(\"%s\", \"a\");\n"
             "    if (f) { fputs(\"%s\\n\", f); fclose(f); }\n"
             "    (void)k;\n    %s\n}\n",
             pre, marks, file, what);
    t_write(t_path(dir, file), text, strlen(text));
}

/* A registration of op with a doc holding a tab, a newline and a '\'. */
static void def_op(char *buf, size_t n, const char *op)
{
    snprintf(buf, n, "opjit_def(m, \"%s(Tensor x, int k=1) -> Tensor\", OPJIT_CPU, k, "
                     "\"its doc:\\tone\\nand two \\\\ three\");", op);
}

/* Everything a listing reported, in order, as text. */
typedef struct listing {
    char text[8192];
    size_t len;
} listing;

static int took(void *ud, const opjit_source_ops *src)
{
    listing *l = ud;
    const char *name = strrchr(src->path, '/') + 1;
    l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len,
                               "%s status=%d tier=%s error=[%s]\n", name, src->status,
                               t_str(src->tier), src->error);
    for (int i = 0; i < src->nops && l->len < sizeof l->text; i++)
        l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len, "  %s [%s]\n",
                                   src->schemas[i], src->docs[i]);
    return 0;
}

/* List dir in a runtime of its own: the transcript into *out, and how
 * many inits ran. */
static int list_dir(const char *dir, listing *out, int *rc)
{
    int before = count_marks();
    opjit_runtime *rt = t_index_rt(dir);
    memset(out, 0, sizeof *out);
    *rc = opjit_discover(rt, took, out);
    opjit_destroy(rt);
    return count_marks() - before;
}

static void test_warm_listing_runs_nothing(void)
{
    const char *d = t_tmpdir("discover");
    char def[512];
    def_op(def, sizeof def, "one");
    write_module(d, "m_one.c", "", def);
    def_op(def, sizeof def, "two");
    write_module(d, "m_two.c", "", def);
    /* abort(): a sanitizer build handles SIGSEGV itself and exits */
    write_module(d, "m_crash.c", "", "abort();");
    write_module(d, "m_exit.c", "", "exit(3);");
    t_write(t_path(d, "m_broken.c"), "#include <opjit_op.h>\nint x = ;\n", 31);
    t_write(t_path(d, "names.h"), "#define HOP \"from_header\"\n", 26);
    write_module(d, "m_hdr.c", "#include \"names.h\"",
                 "opjit_def(m, HOP \"(Tensor x) -> Tensor\", OPJIT_CPU, k, \"\");");
    sleep(3); /* past the racy window: a fresh header is not noted */

    listing cold, warm;
    int rc;
    CHECKF(list_dir(d, &cold, &rc) == 5, "%d inits ran", count_marks());
    CHECK(rc == OPJIT_EMODULE || rc == OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(cold.text, "m_one.c status=0 tier=tcc error=[]\n"
                                  "  one(Tensor x, int k=1) -> Tensor [its doc:\tone\nand two "
                                  "\\ three]\n");
    CHECK_STR_CONTAINS(cold.text, "m_crash.c status=");
    CHECK_STR_CONTAINS(cold.text, "m_crash.c: loading it crashed (signal 6");
    CHECK_STR_CONTAINS(cold.text, "m_exit.c: loading it exited with status 3");
    CHECK_STR_CONTAINS(cold.text, "m_broken.c: compile error");
    CHECK_STR_CONTAINS(cold.text, "from_header(Tensor x) -> Tensor");

    /* Warm: the same answers, statuses and messages included, and no init
     * ran (no child: an init that crashes is not run again either). */
    for (int round = 0; round < 2; round++) {
        int ran = list_dir(d, &warm, &rc);
        CHECKF(ran == 0, "%d inits ran in a warm listing", ran);
        CHECK(rc == OPJIT_EMODULE || rc == OPJIT_ECOMPILE);
        CHECKF(!strcmp(cold.text, warm.text), "cold:\n%s\nwarm:\n%s", cold.text, warm.text);
    }

    /* An edited source is looked at again, alone. */
    def_op(def, sizeof def, "one_renamed");
    write_module(d, "m_one.c", "", def);
    CHECK(list_dir(d, &warm, &rc) == 1);
    CHECK_STR_CONTAINS(warm.text, "one_renamed(Tensor x, int k=1) -> Tensor");
    CHECK(!t_contains(warm.text, "  one(Tensor"));
    CHECK(list_dir(d, &warm, &rc) == 0);

    /* So is a source whose local header changed; while the header is
     * fresh (the racy window) what came is not kept, then it is. */
    t_write(t_path(d, "names.h"), "#define HOP \"header_edited\"\n", 28);
    CHECK(list_dir(d, &warm, &rc) == 1);
    CHECK_STR_CONTAINS(warm.text, "header_edited(Tensor x) -> Tensor");
    CHECK(list_dir(d, &warm, &rc) == 1);
    sleep(3);
    CHECK(list_dir(d, &warm, &rc) == 1);
    CHECK(list_dir(d, &warm, &rc) == 0);
    CHECK_STR_CONTAINS(warm.text, "header_edited(Tensor x) -> Tensor");
}

/* An init that never returns: its timeout is kept with the limit it ran
 * out of; the same limit reports it again without waiting, a longer one
 * looks again. */
static void test_timeout_kept_with_its_limit(void)
{
    const char *d = t_tmpdir("discover-slow");
    write_module(d, "m_hangs.c", "", "for (;;) sleep(1);");
    listing a, b;
    int rc;
    setenv("OPJIT_DISCOVER_TIMEOUT", "1.5", 1);
    CHECK(list_dir(d, &a, &rc) == 1 && rc == OPJIT_EMODULE);
    CHECK_STR_CONTAINS(a.text, "m_hangs.c: loading it did not finish within 1.5 s");
    CHECK(list_dir(d, &b, &rc) == 0 && rc == OPJIT_EMODULE);
    CHECK(!strcmp(a.text, b.text));
    setenv("OPJIT_DISCOVER_TIMEOUT", "2.5", 1);
    CHECK(list_dir(d, &b, &rc) == 1 && rc == OPJIT_EMODULE);
    CHECK_STR_CONTAINS(b.text, "did not finish within 2.5 s");
    CHECK(list_dir(d, &b, &rc) == 0); /* the longer limit's answer is kept too */
    CHECK_STR_CONTAINS(b.text, "did not finish within 2.5 s");
    setenv("OPJIT_DISCOVER_TIMEOUT", "1.5", 1); /* the first answer holds for it */
    CHECK(list_dir(d, &b, &rc) == 0);
    CHECK(!strcmp(a.text, b.text));
    unsetenv("OPJIT_DISCOVER_TIMEOUT");
}

/* A listing's records serve the index's lookups by name, and the index's
 * serve a listing: each source's init runs once in all. */
static void test_index_and_listing_share(void)
{
    listing l;
    int rc;
    char def[512];
    const char *d = t_tmpdir("discover-share");
    def_op(def, sizeof def, "shared_a");
    write_module(d, "m_a.c", "", def);
    def_op(def, sizeof def, "shared_b");
    write_module(d, "m_b.c", "", def);
    CHECK(list_dir(d, &l, &rc) == 2 && rc == OPJIT_OK);
    opjit_runtime *rt = t_index_rt(d);
    opjit_op *op = NULL;
    int before = count_marks();
    CHECK(opjit_load_op(rt, "shared_b", &op) == OPJIT_OK && op);
    CHECKF(t_nlogs_indexed == 0, "%d sources indexed again", t_nlogs_indexed);
    CHECK(count_marks() == before + 1); /* the host's own load */
    opjit_destroy(rt);

    const char *e = t_tmpdir("discover-share2");
    def_op(def, sizeof def, "other_a");
    write_module(e, "m_c.c", "", def);
    def_op(def, sizeof def, "other_b");
    write_module(e, "m_d.c", "", def);
    rt = t_index_rt(e);
    before = count_marks();
    CHECK(opjit_load_op(rt, "other_a", &op) == OPJIT_OK && op);
    CHECK(t_nlogs_indexed == 2 && count_marks() == before + 3); /* 2 children, the load */
    opjit_destroy(rt);
    CHECK(list_dir(e, &l, &rc) == 0 && rc == OPJIT_OK);
    CHECK_STR_CONTAINS(l.text, "m_d.c status=0 tier=tcc error=[]\n  other_b(Tensor x, int k=1)");
}

/* The tier a listing shows comes from the cache at each listing, not
 * from the record: built optimized since, the source says opt. */
static void test_tier_looked_up_each_time(void)
{
    char def[512];
    const char *d = t_tmpdir("discover-tier");
    def_op(def, sizeof def, "tiered");
    write_module(d, "m_tier.c", "", def);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = d;
    cfg.tiering = 1;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    listing l = {0};
    int before = count_marks();
    CHECK(rt && opjit_discover(rt, took, &l) == OPJIT_OK);
    CHECK_STR_CONTAINS(l.text, "m_tier.c status=0 tier=tcc error=[]");
    const char *targets[1] = {t_path(d, "m_tier.c")};
    opjit_warm_options wo = {.size = sizeof wo, .targets = targets, .ntargets = 1, .opt = 1};
    int rc = opjit_warm(rt, &wo, NULL, NULL, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    int warmed = count_marks();
    memset(&l, 0, sizeof l);
    CHECK(opjit_discover(rt, took, &l) == OPJIT_OK);
    CHECK_STR_CONTAINS(l.text, "m_tier.c status=0 tier=opt error=[]");
    CHECK(count_marks() == warmed && warmed >= before + 1); /* the listing ran nothing */
    opjit_destroy(rt);
}

int main(void)
{
    setenv("OPJIT_OPS_PATH", "", 1); /* only the directories named here */
    const char *m = t_tmpdir("discover-marks");
    char *path = strdup(t_path(m, "marks"));
    marks = path;
    T_RUN(test_warm_listing_runs_nothing);
    T_RUN(test_timeout_kept_with_its_limit);
    T_RUN(test_index_and_listing_share);
    T_RUN(test_tier_looked_up_each_time);
    t_tmpdirs_remove();
    free(path);
    return t_done();
}
