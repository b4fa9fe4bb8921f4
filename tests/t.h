/* tests/t.h - the smallest test harness that reports well.
 * Each test file defines test functions, lists them in main with T_RUN, and
 * returns t_done(). A failed check prints file:line and the expression,
 * marks the test failed and continues with the next check. */
#ifndef OPJIT_TEST_T_H
#define OPJIT_TEST_T_H
#include <stdio.h>
#include <string.h>

static int t_failed_checks, t_tests, t_failed_tests;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            t_failed_checks++;                                               \
        }                                                                    \
    } while (0)

/* CHECK with a printf-style explanation. */
#define CHECKF(cond, ...)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, \
                    #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
            t_failed_checks++;                                               \
        }                                                                    \
    } while (0)

static inline int t_contains(const char *hay, const char *needle)
{
    return hay && needle && strstr(hay, needle);
}
static inline const char *t_str(const char *s) { return s ? s : "(null)"; }
#define CHECK_STR_CONTAINS(hay, needle)                                      \
    CHECKF(t_contains((hay), (needle)), "'%s' not in '%s'", (needle),        \
           t_str(hay))

#define T_RUN(fn)                                                            \
    do {                                                                     \
        int before_ = t_failed_checks;                                       \
        t_tests++;                                                           \
        fn();                                                                \
        if (t_failed_checks != before_) {                                    \
            t_failed_tests++;                                                \
            fprintf(stderr, "FAIL %s\n", #fn);                               \
        } else {                                                             \
            fprintf(stderr, "ok   %s\n", #fn);                               \
        }                                                                    \
    } while (0)

/* The lines of path (0 when it is not there): how many times a script or
 * an op's init marked it. */
static inline int t_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

static inline int t_done(void)
{
    printf("%d passed, %d failed\n", t_tests - t_failed_tests, t_failed_tests);
    return t_failed_tests ? 1 : 0;
}
#endif
