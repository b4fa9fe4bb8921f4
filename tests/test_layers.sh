#!/usr/bin/env bash
# tests/test_layers.sh - the modules depend one way (docs/architecture.md):
#   tools/, samples/, python/ -> include/opjit.h, opjit_admin.h
#   loader/ -> jit/, cache/ -> runtime/
# A file may include headers of its own module and of the modules below
# it, never of one above. Fails naming each include that points up.
#
# Env (set by ctest): OPJIT_SOURCE_DIR.
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

# No two files of the library call each other, directly or round a
# circle (cache.c <-> cache_remote.c was one): from the objects as built,
# file A calls file B when A uses a symbol B defines. Circles inside the
# folders in KNOWN_CIRCLES are reported, not failed: they are being taken
# apart (jit/: the compiler table; loader/: loader.c <-> tier.c).
KNOWN_CIRCLES=${KNOWN_CIRCLES-"jit loader"}
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
