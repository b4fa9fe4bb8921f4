#!/usr/bin/env python3
"""tests/docs_check.py - every code block of the README and docs/ is run.

Each fenced block says, in an HTML comment on the line before it, what to
do with it (a block with a language and no comment is an error, so no
example can drift unseen):

  <!-- test: run -->            c: compiled against libopjit.so and run;
                                python: run with the package on the path;
                                sh: run with bash -e (opjit on PATH)
  <!-- test: run torch2 -->     python: run by the torch 2 environment's
                                interpreter (OPJIT_DOCS_TORCH2_PYTHON) with
                                its copy of the package; where the build
                                has none, said and not run
  <!-- test: file NAME -->      written to NAME (an op source, a header,
                                a script a later block runs)
  <!-- test: transcript -->     sh lines "$ cmd" are run; the lines after
                                each, up to the next "$ ", are what it must
                                print ("..." in a line matches anything)
  <!-- test: skip WHY -->       not run, for the reason given

The blocks of one page run in order in one scratch directory, with
OPJIT_OPS_PATH naming the shipped ops and an empty cache. A block that
fails prints the page, its line and what happened.

Usage: docs_check.py REPO_DIR BUILD_DIR [PAGE...]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*test:\s*(\w+)\s*(.*?)\s*-->\s*$")


def blocks(path):
    """(line, lang, directive, argument, text) for each fenced block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i + 1, m.group(1)
        d = DIRECTIVE.match(lines[i - 1]) if i > 0 else None
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        yield start, lang, d.group(1) if d else None, d.group(2) if d else "", \
            "\n".join(lines[i + 1:j]) + "\n"
        i = j + 1


class Page:
    def __init__(self, repo, build, path):
        self.repo, self.build, self.path = repo, build, path
        self.dir = tempfile.mkdtemp(prefix="opjit-docs-")
        self.env = dict(os.environ)
        self.env.update({
            "OPJIT_OPS_PATH": os.path.join(repo, "ops-src"),
            "OPJIT_CACHE_DIR": os.path.join(self.dir, ".cache"),
            # Debian's python3 (numpy, torch) is the python3 of the pages
            "PATH": os.pathsep.join([build, "/usr/bin", self.env.get("PATH", "")]),
            "PYTHONPATH": os.path.join(build, "python"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPJIT_TIERING": "0",
        })
        self.n = 0
        # the pages speak from the repository's root: samples/, ops-src/ there
        for d in ("samples", "ops-src", "include"):
            os.symlink(os.path.join(repo, d), os.path.join(self.dir, d))

    def run(self, argv, env=None, **kw):
        return subprocess.run(argv, cwd=self.dir, env=env or self.env, capture_output=True,
                              text=True, timeout=300, **kw)

    def c(self, text):
        self.n += 1
        src = os.path.join(self.dir, "block%d.c" % self.n)
        exe = src[:-2]
        open(src, "w").write(text)
        lib = os.environ["OPJIT_SHARED_LIB"]
        cc = os.environ.get("OPJIT_CC") or "cc"
        r = self.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", exe, src,
                      "-I", os.path.join(self.repo, "include"),
                      "-I", os.environ.get("OPJIT_DLPACK_INCLUDE_DIR", "/usr/include"),
                      lib, "-Wl,-rpath," + os.path.dirname(lib), "-lm"])
        if r.returncode:
            return "does not compile:\n" + r.stderr
        r = self.run([exe])
        return None if r.returncode == 0 else "exits %d:\n%s%s" % (r.returncode, r.stdout, r.stderr)

    def python(self, text, torch2=False):
        self.n += 1
        script = os.path.join(self.dir, "block%d.py" % self.n)  # a file: TorchScript reads it
        open(script, "w").write(text)
        python, env = os.environ.get("OPJIT_DOCS_PYTHON", "/usr/bin/python3"), None
        if torch2:
            python = os.environ.get("OPJIT_DOCS_TORCH2_PYTHON")
            if not python:
                print("%s: block %d needs the torch 2 environment, which this build has not: "
                      "not run" % (os.path.relpath(self.path, self.repo), self.n))
                return None
            env = dict(self.env, PYTHONPATH=os.path.join(self.build, "python-extra"))
        r = self.run([python, script], **({"env": env} if env else {}))
        return None if r.returncode == 0 else "exits %d:\n%s%s" % (r.returncode, r.stdout, r.stderr)

    def sh(self, text):
        r = self.run(["bash", "-e", "-o", "pipefail", "-c", text])
        return None if r.returncode == 0 else "exits %d:\n%s%s" % (r.returncode, r.stdout, r.stderr)

    def transcript(self, text):
        steps, cur = [], None
        for line in text.rstrip("\n").split("\n"):
            if line.startswith("$ "):
                cur = (line[2:], [])
                steps.append(cur)
            elif cur is not None:
                cur[1].append(line)
        for cmd, want in steps:
            r = self.run(["bash", "-o", "pipefail", "-c", cmd])
            if r.returncode:
                return "$ %s\nexits %d:\n%s%s" % (cmd, r.returncode, r.stdout, r.stderr)
            got = [l.rstrip() for l in r.stdout.rstrip("\n").split("\n")]
            if want and not lines_match(want, got):
                return "$ %s\nprinted:\n%s\nthe page says:\n%s" % (
                    cmd, "\n".join(got), "\n".join(want))
        return None

    def file(self, name, text):
        dest = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        open(dest, "w").write(text)
        return None


def strip_comment(line):
    """A transcript line without its trailing '# ...' remark."""
    return re.sub(r"\s+#\s.*$", "", line).rstrip()


def lines_match(want, got):
    want = [strip_comment(w) for w in want]
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        pattern = "^" + ".*".join(re.escape(p) for p in w.split("...")) + "$"
        if not re.match(pattern, g):
            return False
    return True


def check_page(repo, build, path):
    page, failures = Page(repo, build, path), []
    rel = os.path.relpath(path, repo)
    try:
        for line, lang, directive, arg, text in blocks(path):
            if directive is None:
                if lang:
                    failures.append("%s:%d: a %s block says nothing of how it is tested "
                                    "(<!-- test: run|file|transcript|skip -->)" % (rel, line, lang))
                continue
            if directive == "skip":
                if not arg:
                    failures.append("%s:%d: skip says no reason" % (rel, line))
                continue
            if directive == "file":
                why = page.file(arg, text)
            elif directive == "transcript":
                why = page.transcript(text)
            elif directive == "run" and lang == "python" and arg == "torch2":
                why = page.python(text, torch2=True)
            elif directive == "run" and lang in ("c", "python", "sh") and not arg:
                why = getattr(page, lang)(text)
            else:
                why = "unknown test directive '%s' for a %s block" % (directive, lang or "plain")
            if why:
                failures.append("%s:%d: %s" % (rel, line, why))
    finally:
        shutil.rmtree(page.dir, ignore_errors=True)
    return failures


def main():
    repo, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    pages = sys.argv[3:] or [os.path.join(repo, "README.md")] + sorted(
        os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs"))
        if f.endswith(".md"))
    failures = []
    for p in pages:
        f = check_page(repo, build, p)
        print("%s: %s" % (os.path.relpath(p, repo), "ok" if not f else "%d failed" % len(f)))
        failures += f
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
