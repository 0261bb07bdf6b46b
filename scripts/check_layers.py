#!/usr/bin/env python3
"""check_layers.py [--root DIR] [--self-test] — the layering rules of
docs/architecture.md ("Layers of the code", "The backend behind the table")
that a compiler cannot see, checked on the sources (issue 30 item 6).

Rules, over src/ and tools/ (tests/ and bench/ may reach into a backend):

  backend-ifdef    no #if/#ifdef/#ifndef/#elif on MT_WITH_CUDA outside
                   src/ops/: a build without CUDA compiles the same callers,
                   which learn what they need from the ops table.
  backend-name     no comparison of a backend's name ("cpu", "cuda", or a
                   table's ->name) outside src/ops/, except the option
                   parsing of tools/cmd_*.c (which validates --backend):
                   backend facts come through the table (mt_ops.h).
  backend-header   no include of a backend's own header (src/ops/cpu/,
                   src/ops/cuda/) outside src/ops/.
  model-direct     no BLAS, MPI, CUDA (runtime, cuBLAS, NCCL) or OpenMP in
                   src/model/: neither their headers, nor a call, nor an
                   OpenMP pragma. Model code reaches kernels only through
                   the ops table.
  model-collective no mt_comm.h in src/model/: neither the header nor an
                   mt_comm_* call. The layers' collectives are the model
                   and expert axes' (src/parallel/mt_axis.h: tpa_*, epa_*),
                   which account for them (issue 30 item 4).

Comments are ignored; string literals are ignored except by backend-name
(which looks for the names). Exceptions are listed in ALLOW below, each with
its reason. Exit 0 when clean, 1 listing every finding as FILE:LINE: RULE:
TEXT. --self-test plants one finding of each rule (and one allowed line of
each kind) in a scratch tree and checks that exactly the plants are found.
"""
import argparse
import os
import re
import sys
import tempfile

# (path, stripped line, why): the lines a rule allows by name.
ALLOW = [
    ("src/model/model.c", "#pragma omp parallel for schedule(dynamic, 1) if (n_chunks > 1)",
     "model_param_fill: the host-side init fill of a host array, one pure function per element "
     "(tests/test_init.c checks it equals the serial fill); no kernel, no backend buffer"),
]

IFDEF = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif)\b.*\bMT_WITH_CUDA\b")
CMP = re.compile(r"\b(strn?cmp|strn?casecmp|memcmp)\s*\(")
NAME_LIT = re.compile(r'"(cpu|cuda)"')
NAME_FIELD = re.compile(r"\bops\s*\)?\s*->\s*name\b|\bops\s*\.\s*name\b")
NAME_EQ = re.compile(r"[!=]=\s*mt_ops_(cpu|cuda)\s*\(|\bmt_ops_(cpu|cuda)\s*\([^)]*\)\s*[!=]=")
BACKEND_HDR = re.compile(r'^\s*#\s*include\s*["<][^">]*\bops/(cpu|cuda)/')
MODEL_HDR = re.compile(r"^\s*#\s*include\s*[<\"](cblas|mpi|omp|cuda\w*|cublas\w*|nccl|openblas\w*|lapacke?)\.h[\">]")
MODEL_CALL = re.compile(r"\b(cblas_\w+|openblas_\w+|MPI_[A-Z]\w*|omp_\w+|cuda[A-Z]\w*|cublas\w*|nccl[A-Z]\w*)\s*\(")
MODEL_PRAGMA = re.compile(r"^\s*#\s*pragma\s+omp\b")
MODEL_COMM_HDR = re.compile(r'^\s*#\s*include\s*["<][^">]*\bmt_comm\.h[">]')
MODEL_COMM_CALL = re.compile(r"\bmt_comm_\w+\s*\(")


def strip(text, keep_strings):
    """The text with comments (and, unless keep_strings, string and char
    literals' contents) blanked, line structure kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j] if keep_strings else c + " " * (j - i - 2) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def sources(root):
    for top in ("src", "tools"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith((".c", ".h", ".cu", ".cuh", ".cc")):
                    p = os.path.join(d, f)
                    yield os.path.relpath(p, root).replace(os.sep, "/"), p


def check(root):
    findings, n = [], 0
    allow = {(p, l) for p, l, _ in ALLOW}
    for rel, path in sources(root):
        n += 1
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        raw = text.split("\n")
        with_str = strip(text, True).split("\n")
        bare = strip(text, False).split("\n")
        in_ops = rel.startswith("src/ops/")
        option_parsing = re.match(r"tools/cmd_\w+\.c$", rel) is not None
        in_model = rel.startswith("src/model/")
        for k, (ws, b) in enumerate(zip(with_str, bare)):
            line = raw[k].strip()
            if (rel, line) in allow:
                continue
            hits = []
            if not in_ops:
                if IFDEF.search(b):
                    hits.append("backend-ifdef")
                if CMP.search(ws) and (NAME_FIELD.search(b) or (NAME_LIT.search(ws) and not option_parsing)):
                    hits.append("backend-name")
                elif NAME_EQ.search(b):
                    hits.append("backend-name")
                if BACKEND_HDR.search(ws):
                    hits.append("backend-header")
            if in_model and (MODEL_HDR.search(ws) or MODEL_CALL.search(b) or MODEL_PRAGMA.search(b)):
                hits.append("model-direct")
            if in_model and (MODEL_COMM_HDR.search(ws) or MODEL_COMM_CALL.search(b)):
                hits.append("model-collective")
            findings += ["%s:%d: %s: %s" % (rel, k + 1, h, line) for h in hits]
    return findings, n


PLANTS = {
    # path: (text, the rules it must trigger, in line order)
    "src/train/plant_a.c": ('#include <string.h>\n'
                            '#ifdef MT_WITH_CUDA\n'
                            '#endif\n'
                            '/* #ifdef MT_WITH_CUDA in a comment is fine, so is strcmp(ops->name, "cuda") */\n'
                            'static int f(const struct mt_ops_i *ops) { return !strcmp(ops->name, "cuda"); }\n'
                            'static int g(const char *b) { return strcmp(b, "cpu") == 0; }\n'
                            'static int h(const struct mt_ops_i *ops) { return ops == mt_ops_cpu(); }\n'
                            '#include "../ops/cuda/mt_ops_cuda.h"\n'
                            'static const char *s = "cudaMalloc(x) in a string";\n',
                            ["backend-ifdef", "backend-name", "backend-name", "backend-name", "backend-header"]),
    "src/ops/plant_ok.c": ('#ifdef MT_WITH_CUDA\n#endif\n'
                           'static int f(const char *n) { return !strcmp(n, "cuda"); }\n', []),
    "tools/cmd_plant.c": ('static int f(const char *v) { return strcmp(v, "cpu") && strcmp(v, "cuda"); }\n'
                          'static int g(const struct mt_ops_i *ops) { return !strcmp(ops->name, "cpu"); }\n',
                          ["backend-name"]),
    "src/model/plant_m.c": ('#include <cblas.h>\n'
                            '#include "../parallel/mt_comm.h"\n'
                            'static void f(float *a) { cblas_sscal(4, 2.0f, a, 1); }\n'
                            'static int g(void) { return omp_get_max_threads(); }\n'
                            '#pragma omp parallel for\n'
                            '/* cudaMemcpy in a comment, ops->gemm(ops->be, ...) is the way */\n'
                            'static void h(void) { MPI_Barrier(0); }\n'
                            '#include "../parallel/mt_axis.h"\n'
                            'static int k(void *c) { return mt_comm_barrier(0, c); }\n',
                            ["model-direct", "model-collective"] + ["model-direct"] * 4 + ["model-collective"]),
}


def self_test():
    with tempfile.TemporaryDirectory() as root:
        for rel, (text, _) in PLANTS.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as fh:
                fh.write(text)
        findings, _ = check(root)
    bad = 0
    for rel, (_, want) in PLANTS.items():
        got = [f.split(": ")[1] for f in findings if f.startswith(rel + ":")]
        if got != want:
            print("self-test FAIL %s: found %s, planted %s" % (rel, got, want))
            bad += 1
    if bad:
        for f in findings:
            print("  " + f)
        return 1
    print("check_layers self-test: ok (%d plants found, the allowed lines not)" % sum(len(w) for _, w in PLANTS.values()))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    findings, n = check(os.path.abspath(a.root))
    for f in findings:
        print(f)
    if findings:
        print("check_layers: %d finding(s) in %d files (rules: scripts/check_layers.py; docs/architecture.md)"
              % (len(findings), n))
        return 1
    print("check_layers: ok (%d files under src/ and tools/)" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
