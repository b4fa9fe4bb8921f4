#!/bin/sh
# cmake/opjit-man.sh OPJIT VERSION > opjit.1 - the man page of the opjit
# command, made from its own --help texts (so it cannot drift from them):
# the tool's help, then each command's.
set -eu
opjit=$1
version=$2

# A help text as a roff literal block: backslashes doubled, and a line
# starting with . or ' kept from being read as a request.
literal() {
    printf '.nf\n'
    sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
    printf '.fi\n'
}

printf '.TH OPJIT 1 "" "opjit %s" "User Commands"\n' "$version"
printf '.SH NAME\nopjit \\- compile tensor operators from C and CUDA sources at run time, cache them, and call them\n'
printf '.SH SYNOPSIS\n.B opjit\n[\\fIoptions\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR...]\n'
printf '.SH DESCRIPTION\n'
"$opjit" --help | literal
printf '.SH COMMANDS\n'
for cmd in $("$opjit" --help | sed -n '/^commands:/,/^$/p' | awk 'NF && $1 != "commands:" && $1 != "help" {print $1}'); do
    printf '.SS %s\n' "$cmd"
    "$opjit" "$cmd" --help | literal
done
printf '.SH ENVIRONMENT\nSee docs/environment.md in the opjit source tree for every OPJIT_* variable.\n'
printf '.SH EXIT STATUS\n0 on success, 1 on a failure, 2 on a usage error.\n'
