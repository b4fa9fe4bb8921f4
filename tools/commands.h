/*
 * tools/commands.h - the subcommands of the `opjit` tool and what they share.
 *
 * A subcommand is `int opjit_cmd_NAME(int argc, char **argv)`: argv[0] is
 * the subcommand's name, the rest its arguments (the global options before
 * it are already parsed). It returns the process exit status: 0 success,
 * 1 a runtime failure (message on stderr), 2 a usage error. `--help`/`-h`
 * prints its help to stdout and returns 0. tools/opjit.c dispatches through
 * a table of {name, function, summary}.
 */
#ifndef OPJIT_TOOLS_COMMANDS_H
#define OPJIT_TOOLS_COMMANDS_H

#include "opjit.h"

enum { OPJIT_EXIT_OK = 0, OPJIT_EXIT_FAIL = 1, OPJIT_EXIT_USAGE = 2 };

/* tools/opjit.c */
int opjit_cmd_list(int argc, char **argv);
int opjit_cmd_load(int argc, char **argv);
int opjit_cmd_call(int argc, char **argv);

/* tools/cmd_warm.c */
int opjit_cmd_warm(int argc, char **argv);

/* tools/cmd_cache.c */
int opjit_cmd_cache(int argc, char **argv);

/* Helpers from tools/opjit.c for every subcommand. */

/* opjit_config_init(cfg), then the global options: --cache (cache_dir),
 * --ops-path (ops_path), -v (a log callback printing "opjit: level: msg" to
 * stderr, and its verbosity). The strings stay valid until exit. */
void opjit_cli_config(opjit_config *cfg);

/* opjit_create() with opjit_cli_config(); on failure prints why and
 * returns OPJIT_EXIT_FAIL, else OPJIT_EXIT_OK. */
int opjit_cli_create(opjit_runtime **rt);

/* Options every subcommand may accept after its name, as well as before
 * it: --cache DIR, --ops-path DIR (repeatable), -v/--verbose (-vv more).
 * Looks at argv[*i]: returns 1 and advances *i past the option (and its
 * value) when it is one of them, 0 when it is not, OPJIT_EXIT_USAGE (with a
 * message on stderr) when its value is missing. */
int opjit_cli_common_option(int argc, char **argv, int *i);

/* Help text for the common options, to put in a subcommand's --help. */
extern const char opjit_cli_common_help[];

#endif
