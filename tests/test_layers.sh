#!/usr/bin/env bash
# tests/test_layers.sh - the modules depend one way (docs/architecture.md):
#   tools/, samples/, python/ -> include/opjit.h, opjit_admin.h
#   loader/ -> jit/, cache/ -> runtime/
# A file may include headers of its own module and of the modules below
# it, never of one above. Fails naming each include that points up.
#
# Also: no two files of the library call each other (a circle of calls, read
# from the built objects: file A calls B when A's object uses a function
# B's object defines) or include each other; and the environment is read
# in one file, runtime/settings.c (runtime/settings.h).
#
# Env (set by ctest): OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR.
set -euo pipefail
S=${OPJIT_SOURCE_DIR:?}
cd "$S"

# module: the modules whose headers it may include ("" : none but include/)
declare -A allowed=(
    [runtime]="runtime"
    [jit]="jit runtime"
    [cache]="cache runtime"
    [loader]="loader jit cache runtime"
    [tools]="tools"
    [samples]=""
    [python]=""
)
bad=0
for module in "${!allowed[@]}"; do
    [[ -d $module ]] || continue
    while IFS= read -r line; do
        file=${line%%:*}
        target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
        ok=0
        for a in ${allowed[$module]}; do
            [[ $target == "$a" ]] && ok=1
        done
        if [[ $ok == 0 ]]; then
            echo "FAIL: $line: $module/ may not include $target/ (it is not below $module/)" >&2
            bad=$((bad + 1))
        fi
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' "$module" \
                 --include='*.c' --include='*.h' || true)
done
# Clients of the library (tools/, samples/, python/) see opjit.h and
# opjit_admin.h alone: no generated or private header without a module
# directory either (their own headers, beside the file that includes them,
# are fine).
for module in tools samples python; do
    [[ -d $module ]] || continue
    while IFS= read -r line; do
        file=${line%%:*}
        header=$(sed -E 's/.*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$line")
        [[ -e "$(dirname "$file")/$header" ]] && continue # its own header, beside it
        echo "FAIL: $line: $module/ is a client of opjit.h and opjit_admin.h only" >&2
        bad=$((bad + 1))
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^/"]+"' "$module" \
                 --include='*.c' --include='*.h' | grep -vE '"opjit(_op|_admin)?\.h"' || true)
done
echo "test_layers: $bad include(s) pointing up"

# ---- the environment is read in one file -------------------------------------
while IFS= read -r line; do
    echo "FAIL: $line: only runtime/settings.c reads the environment (runtime/settings.h)" >&2
    bad=$((bad + 1))
done < <(grep -rnE '\b(secure_)?getenv[[:space:]]*\(' runtime loader jit cache \
             --include='*.c' --include='*.h' | grep -v '^runtime/settings\.c:' || true)

# ---- no compiler is named outside jit/ (jit/jit.h: the table) --------------
compiler_name='\bjit_(tcc|cc|nvrtc)(_[a-z_]+)?\b|"(tcc|opt|nvrtc)"'
while IFS= read -r line; do
    code=$(sed -E 's#/\*.*\*/##g; s#^[[:space:]]*(/?\*|//).*##' <<<"${line#*:*:}")
    grep -qE "$compiler_name" <<<"$code" || continue # in a comment
    echo "FAIL: $line: names a compiler outside jit/; go through jit_compilers" >&2
    bad=$((bad + 1))
done < <(grep -rnE "$compiler_name" runtime loader cache --include='*.c' --include='*.h' || true)

# ---- calls go through the device interface (runtime/device.h) -------------
while IFS= read -r line; do
    echo "FAIL: runtime/call.c:$line: call.c asks which device; use its device_ops" >&2
    bad=$((bad + 1))
done < <(grep -nE '[!=]=[[:space:]]*OPJIT_(CUDA|CPU)\b|\bOPJIT_(CUDA|CPU)[[:space:]]*[!=]=|case[[:space:]]+OPJIT_(CUDA|CPU)\b' \
             runtime/call.c || true)

# ---- no circle of two files --------------------------------------------------
# Pairs still in a circle while another branch reworks them (cache/'s layer
# interface takes cache.c <-> cache_remote.c apart).
allowed_circles=" "
circle() { # a b what
    if [[ $allowed_circles == *" $1:$2 "* || $allowed_circles == *" $2:$1 "* ]]; then
        echo "test_layers: allowed for now: $1 <-> $2 ($3)"
        return
    fi
    echo "FAIL: $1 and $2 $3 each other (a circle of two files)" >&2
    bad=$((bad + 1))
}
objs=${OPJIT_BINARY_DIR:?}/CMakeFiles/opjit_objects.dir
[[ -d $objs/runtime ]] || { echo "FAIL: no objects under $objs (build the library first)" >&2; exit 1; }
declare -A defines
mapfile -t objects < <(cd "$objs" && find runtime loader jit cache -name '*.c.o' | sort)
for o in "${objects[@]}"; do
    while read -r sym; do defines[$sym]=${o%.o}; done < <(nm -g --defined-only "$objs/$o" |
        awk '$2 == "T" || $2 == "W" {print $3}')
done
declare -A calls
for o in "${objects[@]}"; do
    while read -r sym; do
        t=${defines[$sym]:-}
        [[ -n $t && $t != "${o%.o}" ]] && calls["${o%.o} $t"]=1
    done < <(nm -u "$objs/$o" | awk '{print $2}')
done
for edge in "${!calls[@]}"; do
    read -r a b <<<"$edge"
    [[ $a < $b && -n ${calls["$b $a"]:-} ]] && circle "$a" "$b" call
done
declare -A incl
while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$line")
    incl["$file $target"]=1
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/[a-z_]+\.h"' \
             runtime loader jit cache --include='*.h' || true)
for edge in "${!incl[@]}"; do
    read -r a b <<<"$edge"
    [[ $a < $b && -n ${incl["$b $a"]:-} ]] && circle "$a" "$b" include
done
echo "test_layers: $bad problem(s)"

# No two files of the library call each other, directly or round a
# circle (cache.c <-> cache_remote.c was one): from the objects as built,
# file A calls file B when A uses a symbol B defines. Circles inside the
# folders in KNOWN_CIRCLES (none today) are reported, not failed.
KNOWN_CIRCLES=${KNOWN_CIRCLES-""}
objs=${OPJIT_BINARY_DIR:-}/CMakeFiles/opjit_objects.dir
circles=0
if [[ -d $objs ]] && command -v nm >/dev/null && command -v python3 >/dev/null; then
    circles=$(python3 - "$objs" "$KNOWN_CIRCLES" <<'PY'
import collections, os, subprocess, sys
objdir, known = sys.argv[1], sys.argv[2].split()
defs, uses, files = {}, collections.defaultdict(set), []
for root, _, names in os.walk(objdir):
    for n in sorted(names):
        if n.endswith('.c.o'):
            path = os.path.join(root, n)
            files.append((os.path.relpath(path, objdir)[:-2], path))
for src, path in files:
    for line in subprocess.run(['nm', path], capture_output=True, text=True).stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in 'TDBRV':
            defs.setdefault(f[2], src)
        elif len(f) == 2 and f[0] == 'U':
            uses[src].add(f[1])
calls = {src: {defs[s] for s in uses[src] if s in defs and defs[s] != src} for src, _ in files}
# Tarjan's strongly connected components: each of more than one file is a circle.
index, low, on, stack, out = {}, {}, set(), [], []
def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v); on.add(v)
    for w in sorted(calls.get(v, ())):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            out.append(sorted(comp))
sys.setrecursionlimit(10000)
for v, _ in files:
    if v not in index:
        visit(v)
failed = 0
for comp in out:
    ok = all(f.split('/')[0] in known for f in comp)
    print(('known circle: ' if ok else 'FAIL: circle of calls: ') + ' '.join(comp), file=sys.stderr)
    for a in comp:
        for b in sorted(calls[a] & set(comp)):
            print('    %s -> %s' % (a, b), file=sys.stderr)
    failed += not ok
print(failed)
PY
)
else
    echo "no objects in ${objs} (or no nm/python3): the circle check is skipped"
fi
echo "test_layers: $circles circle(s) of calls between files"
[[ $bad == 0 && $circles == 0 ]]
