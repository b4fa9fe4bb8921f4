/*
 * tools/opjit.c - the `opjit` command: global options and subcommand
 * dispatch. Each subcommand lives in tools/cmd_NAME.c; what they share in
 * tools/cli.c.
 *
 *   opjit [--cache DIR] [--ops-path DIR] [-v] COMMAND [ARGS...]
 *
 * Exit status: 0 success, 1 a runtime failure (the message on stderr),
 * 2 a usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

typedef struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} cli_command;

static const cli_command cli_commands[] = {
    {"list", cmd_list, "list the operators on the search path, with their schemas"},
    {"load", cmd_load, "compile and register source files, with timings"},
    {"call", cmd_call, "call an operator on .npy tensors and numbers"},
    {"warm", cmd_warm, "compile operators into the cache ahead of time"},
    {"cache", cmd_cache, "list, verify, prune and clear the cache"},
    {"watch", cmd_watch, "load the sources and reload them as they are edited"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: opjit [options] COMMAND [ARGS...]\n"
            "       opjit --version\n"
            "\n"
            "Compile tensor operators from C and CUDA sources at run time, cache them,\n"
            "and call them.\n"
            "\n"
            "commands:\n");
    for (const cli_command *c = cli_commands; c->name; c++)
        fprintf(f, "  %-8s %s\n", c->name, c->summary);
    fprintf(f, "  %-8s %s\n", "help", "show the help of a command");
    fprintf(f, "\noptions:\n%s", cli_common_help);
    fprintf(f, "  -h, --help       this help\n"
               "  --version        the version of opjit\n"
               "\n"
               "Run 'opjit COMMAND --help' for the options of a command.\n");
}

static const cli_command *find_command(const char *name)
{
    for (const cli_command *c = cli_commands; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

static int version(void)
{
    printf("opjit %s\n", opjit_version_string());
    if (opjit_version() != OPJIT_VERSION_NUMBER)
        fprintf(stderr, "opjit: warning: built with opjit.h %d.%d.%d but linked "
                        "with library %s\n",
                OPJIT_VERSION_MAJOR, OPJIT_VERSION_MINOR, OPJIT_VERSION_PATCH,
                opjit_version_string());
    return CLI_EXIT_OK;
}

/* The global options before COMMAND; *cmd receives the index of COMMAND
 * (argc when there is none). -1 to go on, else the exit status to end with
 * (help or version printed, a usage error). */
static int global_options(int argc, char **argv, int *cmd)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (cli_is_help(a)) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(a, "--version") == 0)
            return version();
        int r = cli_common_option(argc, argv, &i);
        if (r == CLI_EXIT_USAGE)
            return CLI_EXIT_USAGE;
        if (r != 1)
            return cli_usage_error(NULL, "unknown option '%s'", a);
        i--;
    }
    *cmd = i;
    return -1;
}

/* "opjit help [COMMAND]" */
static int help(int argc, char **argv, int i)
{
    if (i + 1 >= argc) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    const cli_command *c = find_command(argv[i + 1]);
    if (!c)
        return cli_usage_error(NULL, "unknown command '%s'", argv[i + 1]);
    char *help_argv[] = {(char *)c->name, "--help", NULL};
    return c->fn(2, help_argv);
}

static int run(int argc, char **argv)
{
    int i = argc, rc = global_options(argc, argv, &i);
    if (rc >= 0)
        return rc;
    if (i >= argc) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0)
        return help(argc, argv, i);
    const cli_command *c = find_command(argv[i]);
    if (!c)
        return cli_usage_error(NULL, "unknown command '%s'", argv[i]);
    return c->fn(argc - i, argv + i);
}

int main(int argc, char **argv)
{
    int rc = run(argc, argv);
    if (fflush(stdout) != 0 && rc == CLI_EXIT_OK) {
        fprintf(stderr, "opjit: error writing the output: %s\n", strerror(errno));
        rc = CLI_EXIT_FAIL;
    }
    free(cli_opt.ops_path);
    return rc;
}
