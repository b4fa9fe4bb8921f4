/*
 * tools/cli.h - the subcommands of the `opjit` tool and what they share.
 *
 * The tool is a client of opjit.h and opjit_admin.h alone: no header of the library's
 * modules is included anywhere in tools/ (tests/test_cli_includes.sh
 * checks it).
 *
 * A subcommand is `int cmd_NAME(int argc, char **argv)` in tools/cmd_NAME.c:
 * argv[0] is the subcommand's name, the rest its arguments (the global
 * options before it are already parsed). It returns the process exit
 * status: 0 success, 1 a runtime failure (message on stderr), 2 a usage
 * error. `--help`/`-h` prints its help to stdout and returns 0. tools/opjit.c
 * dispatches through a table of {name, function, summary}.
 */
#ifndef OPJIT_TOOLS_CLI_H
#define OPJIT_TOOLS_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "opjit_admin.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/* ---- the subcommands ---- */

int cmd_list(int argc, char **argv);  /* tools/cmd_list.c */
int cmd_load(int argc, char **argv);  /* tools/cmd_load.c */
int cmd_call(int argc, char **argv);  /* tools/cmd_call.c */
int cmd_warm(int argc, char **argv);  /* tools/cmd_warm.c */
int cmd_cache(int argc, char **argv); /* tools/cmd_cache.c */
int cmd_cache_why(int argc, char **argv); /* tools/cmd_why.c */
int cmd_watch(int argc, char **argv); /* tools/cmd_watch.c */

/* ---- shared helpers (tools/cli.c) ---- */

/* The global options, as parsed so far. */
typedef struct cli_options {
    const char *cache_dir;
    char *ops_path; /* --ops-path values joined with ':' (heap), or NULL */
    int verbose;    /* -v: 1, -vv: 2, -q: -1 */
} cli_options;
extern cli_options cli_opt;

/* opjit_config_init(cfg, sizeof *cfg), then the global options: --cache (cache_dir),
 * --ops-path (ops_path), -v/-q (a log callback printing "opjit: level: msg"
 * to stderr, and its verbosity; none with -q). The strings stay valid
 * until exit. */
void cli_config(opjit_config *cfg);

/* opjit_create(cfg); on failure prints why and returns CLI_EXIT_FAIL (*rt
 * NULL), else CLI_EXIT_OK. */
int cli_create_with(const opjit_config *cfg, opjit_runtime **rt);
/* cli_create_with(cli_config()). */
int cli_create(opjit_runtime **rt);

/* Options every subcommand may accept after its name, as well as before
 * it: --cache DIR, --ops-path DIR (repeatable), -v/--verbose (-vv more),
 * -q/--quiet. Looks at argv[*i]: returns 1 and advances *i past the option
 * (and its value) when it is one of them, 0 when it is not, CLI_EXIT_USAGE
 * (with a message on stderr) when its value is missing. */
int cli_common_option(int argc, char **argv, int *i);
/* The same for loops that advance i themselves: 1 consumed (i left on its
 * last word), 0 not, -1 a usage error already reported. */
int cli_common_opt(int argc, char **argv, int *i);

/* Matches "--name VALUE" and "--name=VALUE". 1: matched, *val set and *i
 * advanced past a separate value; 0: not this option; -1: value missing
 * (reported). */
int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **val);

/* Help text for the common options, to put in a subcommand's --help. */
extern const char cli_common_help[];

int cli_is_help(const char *arg);

/* "opjit: CMD: <message>\nTry 'opjit CMD --help'." on stderr; returns
 * CLI_EXIT_USAGE. cmd NULL: the top level. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* An --arch LIST of `cmd`: 0 when each word looks like sm_XY or
 * compute_XY, else a usage error naming --arch (reported; returns
 * CLI_EXIT_USAGE). */
int cli_check_archs(const char *cmd, const char *list);

/* The runtime's message for a failure about `what` (a file, an op) on
 * stderr: the message alone when it already names it. */
void cli_rt_error(opjit_runtime *rt, const char *what);

/* The op name of a source file name: "nms.c" -> 3 (its length), else 0. */
size_t cli_source_stem(const char *file);

/* 1 when a and b name the same file. */
int cli_same_file(const char *a, const char *b);

/* A growable list of strings (heap copies). */
typedef struct cli_strs {
    char **v;
    int n, cap;
} cli_strs;
/* Append a copy of s: 0, or -1 when out of memory. */
int cli_strs_add(cli_strs *l, const char *s);
void cli_strs_free(cli_strs *l);

/* ---- tensors as text (tools/print.c) ---- */

/* "(2, 3)", "(3,)", "()" */
void cli_format_shape(char *buf, size_t len, const DLTensor *t);
/* "float32"; "dtype(code=.., bits=.., lanes=..)" for one opjit has no name
 * for. */
const char *cli_dtype_name(DLDataType dt, char *buf, size_t len);
/* "LABEL: shape (2, 2), dtype float32" and, when it is small enough and in
 * host memory, its values as numpy prints them. */
void cli_print_tensor(FILE *f, const char *label, const DLTensor *t);
/* 1 when t's data is in host memory. */
int cli_host_tensor(const DLTensor *t);
/* s (NULL: "") into buf with control bytes, backslashes, C1 controls and
 * bytes that are not UTF-8 written C-style (\n, \x1b, \\): a file or op
 * name from disk never reaches a terminal raw. keep: CLI_ESC_LINES leaves
 * newlines and tabs (a compiler's diagnostics), CLI_ESC_BACKSLASH leaves
 * backslashes (a message whose names the library escaped already). Cut
 * short to fit; returns buf. */
enum { CLI_ESC_LINES = 1, CLI_ESC_BACKSLASH = 2 };
const char *cli_escape(const char *s, int keep, char *buf, size_t len);

/* ---- JSON (tools/print.c) ----
 * What --json prints, the same on every command: one JSON document on
 * stdout (an array of rows for listings, an object for one result), keys
 * in snake_case, sizes in bytes, times in milliseconds ("*_ms"), absent
 * values null; warnings and errors stay on stderr and the exit status is
 * the text output's. */

/* s as a JSON string; bytes that are not UTF-8 become U+FFFD. */
void cli_json_str(FILE *f, const char *s);
/* The same, or null for a NULL s. */
void cli_json_opt_str(FILE *f, const char *s);
/* "shape": [2, 3], "dtype": "float32", "values": [[...], ...] (the fields
 * of an object); values null when asked not to (0) or where text output
 * would not print them (over 1000 elements, not in host memory, a dtype
 * without a name); nan and infinities are null. */
void cli_json_tensor_fields(FILE *f, const DLTensor *t, int values);

#endif
