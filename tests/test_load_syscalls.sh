#!/usr/bin/env bash
# tests/test_load_syscalls.sh - the load path does no needless work (#26.3),
# seen from the system calls of whole `opjit load` processes (strace):
#   a cold load: no fsync (every load checks an entry, see docs/cache.md),
#   no byte-at-a-time read() (libtcc's own reading of the libc.so
#   and libm.so linker scripts), nothing made in $TMPDIR (opjit_op.h goes
#   into the build's own directory, not a directory of its own: no rmdir);
#   a cache hit, tiering off: no mkdir (the cache exists), no sweep of
#   tmp/ (it is empty), no readlink of a local header (one per path
#   component before), no search of $PATH for the optimizing compiler, no
#   /proc/self/exe (the shipped ops are looked for only by a lookup by
#   name), no membarrier registration (left to the first reclaim scan),
#   no fsync, no read() that only finds the end of a file, the artifact
#   checked through a mapping (not read into the heap, its headers again),
#   no uname (the host triple is the build's), each path a local include
#   may name looked up once (however many files include it), the entry's
#   directory not stat()ed before its lock, nor opened a second time to
#   list it;
#   a .cu cache hit (where NVRTC is here to fill the cache): no NVRTC
#   loaded (its file stat()ed once, for its id), an index entry's small key read, not mapped, the entry not
#   stat()ed twice for a probe, and no 64 KiB buffer for the toolkit
#   headers' hash.
# Skipped (77) without strace.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR.
set -euo pipefail
. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
S=${OPJIT_SOURCE_DIR:?}
if ! command -v strace >/dev/null; then
    echo "strace not installed (Debian package strace); skipping" >&2
    exit 77
fi
C=$T/cache
mkdir -p "$T/tmp"
export OPJIT_CACHE_DIR=$C OPJIT_TIERING=0 TMPDIR=$T/tmp
unset OPJIT_REMOTE_CACHE OPJIT_CACHE_READONLY
SRC=$S/ops-src/nms.c

# traced NAME ARGS...: the opjit tool under strace (every thread and child),
# its calls in $T/NAME.trace; its output as run keeps it.
traced() {
    local name=$1
    shift
    # LeakSanitizer cannot run under ptrace (a sanitizer build's tool).
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        run strace -f -qq -s 64 -o "$T/$name.trace" "$CLI" "$@"
}
# none WHAT NAME REGEX [MAX]: no line (at most MAX lines) of NAME's trace
# matches.
none() {
    local what=$1 name=$2 re=$3 max=${4:-0} hits
    hits=$(grep -cE -- "$re" "$T/$name.trace" || true)
    if [[ $hits -le $max ]]; then
        pass
    else
        fail "$what: $hits calls, e.g.: $(grep -m2 -E -- "$re" "$T/$name.trace" | cut -c1-200)"
    fi
}

traced cold load "$SRC"
expect "a cold load" 0 "compiled"
none "cold: no fsync" cold '(fsync|fdatasync|syncfs|sync_file_range)\('
# (A sanitizer's runtime reads /proc/self/maps a byte at a time at its
# very end, a few times; libtcc read its scripts that way, 400 times.)
none "cold: no read of one byte at a time" cold 'read\([0-9]+, .*, 1\) += 1$' 8
# opjit_op.h is written into the build's own directory: no directory made
# and removed for it (an rmdir costs a tenth of a millisecond and more).
none "cold: no directory removed" cold 'rmdir\('
none "cold: nothing made in \$TMPDIR" cold "mkdir(at)?\\((AT_FDCWD, )?\"$T/tmp/"
# libtcc reads the text and writes the object in memory (jit/tcc.c), and
# opjit_op.h is read where the source tree keeps it (loader/pipeline.c:
# where only its owner can change it): no file made and removed for them.
none "cold: the text and the object are not files" cold 'unlink(at)?\(.*\.opjit-(source\.c|op\.o)"'
# (Where the source tree, or a directory above it, is writable by others,
# the library writes its own copy: not checked then.)
only_owner_writes() {
    local d m
    d=$(realpath "$1")
    while :; do
        m=$(stat -c %a "$d")
        [[ ${#m} -eq 4 && ${m:0:1} == [1357] ]] || [[ ${m: -2:1} != [2367] && ${m: -1} != [2367] ]] ||
            return 1
        [[ $d == / ]] && return 0
        d=$(dirname "$d")
    done
}
if only_owner_writes "$S/include"; then
    none "cold: opjit_op.h is not copied into the build" cold 'open(at)?\(.*/tmp/[^"]*/opjit_op\.h", O_WRONLY'
fi
check "cold: \$TMPDIR is left empty" test -z "$(ls -A "$T/tmp")"
# <opjit_op.h> and the glibc headers under it come preprocessed with the
# library (jit/tcc_prelude.h): libtcc does not look for them again.
none "cold: opjit_op.h's system headers are not read" cold \
    'open(at)?\(.*/(sys/cdefs|bits/types|dlpack/dlpack)\.h", O_RDONLY\)'

traced hit load "$SRC"
expect "a cache hit" 0 "cache hit"
none "hit: no mkdir" hit 'mkdir(at)?\('
none "hit: no sweep of an empty tmp/" hit "open(at)?\\((AT_FDCWD, )?\"$C/v1/tmp\""
none "hit: no readlink of a local header" hit 'readlink(at)?\(.*nms_(common|decl)\.h"'
none "hit: no search of PATH for cc with tiering off" hit '(stat|access)[a-z0-9]*\(.*/cc"'
# The sanitizers' runtimes read /proc/self/exe themselves.
if ! grep -q '^OPJIT_SANITIZE:BOOL=ON' "${OPJIT_BINARY_DIR:-}/CMakeCache.txt" 2>/dev/null; then
    none "hit: no /proc/self/exe on a load by path" hit 'readlink(at)?\(.*"/proc/self/exe"'
fi
none "hit: no membarrier registration" hit 'membarrier\(MEMBARRIER_CMD_REGISTER'
none "hit: no fsync" hit '(fsync|fdatasync|syncfs)\('
# Each file is read by the size fstat gave (no read more to find its end),
# and the artifact is checksummed and ELF-checked through a mapping, not
# read 16 KiB at a time into the heap (then its headers read again).
# (A sanitizer's runtime reads /proc/self/maps and the like to their end
# itself, a few times.)
eof_reads_allowed=0
grep -qE '^OPJIT_(SANITIZE|TSAN):BOOL=ON' "${OPJIT_BINARY_DIR:-}/CMakeCache.txt" 2>/dev/null &&
    eof_reads_allowed=8
none "hit: no read() that only finds the end of a file" hit 'read\([0-9]+, "", [0-9]+\) += 0' \
    "$eof_reads_allowed"
none "hit: the artifact is mapped, not read" hit 'read\([0-9]+, "\\177ELF.*, 16384\) += '
none "hit: no pread of the artifact's ELF headers" hit 'pread64\([0-9]+, "\\177ELF[^"]*", 16, 0\)'

none "hit: no uname" hit 'uname\('
# nms.c and its headers include opjit_op.h and <string.h> each: one lookup.
for h in opjit_op.h string.h nms_common.h; do
    none "hit: $h looked up once" hit "stat[a-z0-9]*\\((AT_FDCWD, )?\"[^\"]*/ops-src/$h\"" 1
done
none "hit: the entry listed through the descriptor it was checked by" hit 'openat\([0-9]+, "\.", '
none "hit: no stat of the entry's directory" hit "stat[a-z0-9]*\\((AT_FDCWD, )?\"$C/v1/entries/"

# A .cu hit: its device code through the index entry, its host half.
if run env OPJIT_CUDA_ARCHS=sm_90 "$CLI" load "$S/ops-src/nms.cu" && [[ $rc == 0 ]]; then
    OPJIT_CUDA_ARCHS=sm_90 traced cuhit load "$S/ops-src/nms.cu"
    expect "a .cu cache hit" 0 "cache hit"
    none "cu hit: NVRTC not loaded" cuhit 'open(at)?\(.*libnvrtc[^"]*", O_RDONLY'
    # Its file id comes from the stat that found it: one, not two.
    none "cu hit: NVRTC's file stat()ed once" cuhit 'stat[a-z0-9]*\((AT_FDCWD, )?"[^"]*libnvrtc[^"]*", \{' 1
    # Each index entry's directory: one lstat for the probe, not two.
    dup=$(grep -oE "stat[a-z0-9]*\((AT_FDCWD, )?\"$C/v1/entries/[^\"]*\"" "$T/cuhit.trace" |
          sort | uniq -d | head -1)
    check "cu hit: no entry stat()ed twice${dup:+ ($dup)}" test -z "$dup"
    none "cu hit: the index entry's key is read, not mapped" cuhit 'mmap\(NULL, 32, PROT_READ'
    # cudnn_version.h hashed a page at a time, not read into 64 KiB of heap
    # (which a host's malloc may get by growing the heap, then give back).
    none "cu hit: no 64 KiB read of a toolkit header" cuhit 'read\([0-9]+, .*, 65536\) = '
    # Its architectures from the machine's GPUs: the driver asked for, and
    # where it is not installed, not looked for in glibc's some 90 places
    # (a hit: NVRTC, which compiles, looks for it itself).
    run "$CLI" load "$S/ops-src/nms.cu"
    traced cudefault load "$S/ops-src/nms.cu"
    expect "a .cu hit with the machine's architectures" 0 "cache hit"
    none "cu: libcuda.so.1 not searched for where it is not" cudefault \
        'open(at)?\(.*glibc-hwcaps/[^"]*/libcuda\.so\.1"'
else
    echo "note: no NVRTC here (nms.cu did not load): the .cu hit checks are skipped" >&2
fi

echo "test_load_syscalls: $passed passed, $failed failed"
[[ $failed == 0 ]]
