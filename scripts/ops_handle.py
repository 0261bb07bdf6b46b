#!/usr/bin/env python3
"""ops_handle.py [--root DIR] [--dry-run | --apply] — give every ops-table entry the
backend instance as its first argument (issue 19 item 4; docs/cuda.md, "The
backend handle").

A mechanical, re-runnable rewrite of the tree at DIR (default: this
checkout), meant to be applied once after the wave's branches are merged:

  1. src/ops/mt_ops.h: struct mt_ops_i gets `void *be;` after `name`, and
     every function-pointer entry gets `void *be` as its first parameter
     (`(void)` becomes `(void *be)`). The entries are read from the header
     each run, so entries added since (fused kernels, ...) are covered.
  2. Every call through a table, `X->entry(...)` where X ends in ops, g_ops,
     cuda or cpu (`ops`, `m->ops`, `b->ops`, `g_be[1].ops`, ...), becomes
     `X->entry(X->be, ...)` in src/, tests/, tools/, bench/.
  3. The backends: each function the cpu table (src/ops/cpu/ops_cpu.c) or
     the cuda table (src/ops/cuda/ops_cuda.cu) names gets the parameter
     `void *be` (definitions, and prototypes in the backend's headers);
     bodies start with `(void)be;` (the cpu backend is stateless; the cuda
     entries still reach their instance through mt_cuda_be until step 2 of
     the design replaces it by the parameter, file by file). Direct calls
     of those functions inside a backend pass `be` (cpu) or `mt_cuda_be`
     (cuda). The cuda table becomes non-const and carries its instance
     (`cuda_ops.be = mt_cuda_be` in mt_ops_cuda()).
     [Since applied and superseded for the cuda side: the entries bind
     their `be` (MT_CUDA_BIND) and mt_ops_cuda() hands out its default
     instance, so a rerun reports that explicit rule as unmatched.]
  4. Entries used as values rather than called (today only `copy`, handed
     to the device mesh): the dist layer's copy callback carries its `be`
     next to it (explicit rules below, each checked).

Idempotent: a second run changes nothing (calls that already pass `->be`,
parameters already named `be` are left alone). Exit 0 when everything
applied (or was already applied); exit 1, listing them, when an explicit
rule's text was not found (the code moved: apply that rule by hand), or a
call through a table could not be rewritten mechanically.
"""
import argparse
import glob
import os
import re
import sys

OPS_BASES = ("ops", "g_ops", "cuda", "cpu")
SCAN_DIRS = ("src", "tests", "tools", "bench")
SCAN_EXT = (".c", ".h", ".cu", ".cuh", ".cc")

# (file, old, new): explicit rewrites for entries used as values. Applied
# when `old` is present; fine when `new` is already there; an error otherwise.
RULES = [
    ("src/parallel/comm_impl.h",
     "typedef void (*mt_comm_copy_fn)(void *dst, const void *src, size_t bytes);",
     "typedef void (*mt_comm_copy_fn)(void *be, void *dst, const void *src, size_t bytes);"),
    ("src/parallel/comm_impl.h",
     "    mt_comm_copy_fn         copy;",
     "    void                   *copy_be;  /* the backend instance `copy` receives */\n"
     "    mt_comm_copy_fn         copy;"),
    ("src/parallel/comm_impl.h",
     "enum mt_status mt_comm_create_self_dev(struct mt_ctx *ctx, mt_comm_copy_fn copy, struct mt_comm **out);",
     "enum mt_status mt_comm_create_self_dev(struct mt_ctx *ctx, mt_comm_copy_fn copy, void *copy_be,\n"
     "                                       struct mt_comm **out);"),
    ("src/parallel/comm.c", "if (c->copy) c->copy(dst, src, bytes);", "if (c->copy) c->copy(c->copy_be, dst, src, bytes);"),
    ("src/parallel/comm.c", "mt_comm_create_self_dev(ctx, parent->copy, out);",
     "mt_comm_create_self_dev(ctx, parent->copy, parent->copy_be, out);"),
    ("src/parallel/comm.c",
     "enum mt_status mt_comm_create_self_dev(struct mt_ctx *ctx, mt_comm_copy_fn copy, struct mt_comm **out)",
     "enum mt_status mt_comm_create_self_dev(struct mt_ctx *ctx, mt_comm_copy_fn copy, void *copy_be,\n"
     "                                       struct mt_comm **out)"),
    ("src/parallel/comm.c", "    (*out)->copy = copy;", "    (*out)->copy = copy;\n    (*out)->copy_be = copy_be;"),
    ("src/parallel/mt_mesh.h",
     "    void (*copy)(void *dst, const void *src, size_t bytes);",
     "    void (*copy)(void *be, void *dst, const void *src, size_t bytes);"),
    ("src/parallel/mt_mesh.h",
     "                        groups move backend buffers with it, never with memmove */\n};",
     "                        groups move backend buffers with it, never with memmove */\n"
     "    void  *copy_be;  /* the backend instance copy receives (ops->be) */\n};"),
    ("src/parallel/mesh.c", "mt_comm_create_self_dev(ctx, o->copy, out)", "mt_comm_create_self_dev(ctx, o->copy, o->copy_be, out)"),
    ("src/parallel/mesh.c", "mt_comm_create_self_dev(ctx, dev->copy, &dc)",
     "mt_comm_create_self_dev(ctx, dev->copy, dev->copy_be, &dc)"),
    ("src/train/setup.c", "mt_ops_cuda_stream(), rs->ops->copy};", "mt_ops_cuda_stream(), rs->ops->copy, rs->ops->be};"),
    ("tests/cuda/mesh_device.c", "static void copy_counted(void *dst, const void *src, size_t bytes)",
     "static void copy_counted(void *be, void *dst, const void *src, size_t bytes)"),
    ("tests/cuda/mesh_device.c", "    g_ops->copy(g_ops->be, dst, src, bytes);", "    g_ops->copy(be, dst, src, bytes);"),
    ("tests/cuda/mesh_device.c", "{0, mt_ops_cuda_stream(), copy_counted};", "{0, mt_ops_cuda_stream(), copy_counted, g_ops->be};"),
    ("tests/test_nccl_build.sh", "struct mt_mesh_nccl_opts o = {0, NULL, host_copy};",
     "struct mt_mesh_nccl_opts o = {0, NULL, host_copy, NULL};"),
    ("tests/cuda/mesh_device.c", "struct mt_mesh_nccl_opts bad = {0, NULL, NULL};",
     "struct mt_mesh_nccl_opts bad = {0, NULL, NULL, NULL};"),
    ("tests/test_nccl_build.sh",
     "static void host_copy(void *dst, const void *src, size_t bytes) { n_copies++; memcpy(dst, src, bytes); }",
     "static void host_copy(void *be, void *dst, const void *src, size_t bytes)\n"
     "{\n    (void)be;\n    n_copies++;\n    memcpy(dst, src, bytes);\n}"),
    ("src/ops/cuda/ops_cuda.cu", "static const struct mt_ops_i cuda_ops = {", "static struct mt_ops_i cuda_ops = {"),
    ("src/ops/cuda/ops_cuda.cu", '    /* .name                 = */ .name                 = "cuda",\n',
     '    /* .name                 = */ .name                 = "cuda",\n'
     '    /* .be                   = */ .be                   = NULL,   /* set by mt_ops_cuda() */\n'),
    ("src/ops/cuda/ops_cuda.cu", "    if (why && why_len) why[0] = 0;\n    return &cuda_ops;",
     "    if (why && why_len) why[0] = 0;\n    cuda_ops.be = mt_cuda_be;   /* the instance every entry receives */\n"
     "    return &cuda_ops;"),
]

problems = []


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text, dry):
    if not dry:
        with open(path, "w") as f:
            f.write(text)


def close_paren(s, i):
    """index just after the parenthesis matching s[i] == '('"""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "(":
            depth += 1
        elif s[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def add_be_param(s, open_idx):
    """s[open_idx] == '(' of a parameter list: prepend `void *be`"""
    end = close_paren(s, open_idx)
    params = s[open_idx + 1:end - 1]
    if re.match(r"\s*void\s*\*\s*be\b", params):
        return s, False
    if params.strip() == "void":
        return s[:open_idx + 1] + "void *be" + s[end - 1:], True
    return s[:open_idx + 1] + "void *be, " + s[open_idx + 1:], True


def header(root, dry):
    path = os.path.join(root, "src/ops/mt_ops.h")
    s = read(path)
    a = s.index("struct mt_ops_i {")
    b = s.index("\n};", a)
    body = s[a:b]
    names = re.findall(r"\(\s*\*\s*(\w+)\s*\)\s*\(", body)
    out, pos, changed = [], 0, 0
    for m in re.finditer(r"\(\s*\*\s*(\w+)\s*\)\s*\(", body):
        out.append(body[pos:m.end() - 1])
        rest = body[m.end() - 1:]
        new, ch = add_be_param(rest, 0)
        end = close_paren(rest, 0)
        newend = close_paren(new, 0)
        out.append(new[:newend])
        pos = m.end() - 1 + end
        changed += ch
    out.append(body[pos:])
    body = "".join(out)
    if not re.search(r"\bvoid\s*\*\s*be;", body):
        body = re.sub(r"(const char \*name;[^\n]*\n)",
                      r"\1    void       *be;    /* the backend instance: every entry receives it first, ops->gemm(ops->be, ...) */\n",
                      body, count=1)
        changed += 1
    s = s[:a] + body + s[b:]
    write(path, s, dry)
    return names, changed


def files(root):
    for d in SCAN_DIRS:
        for p in glob.glob(os.path.join(root, d, "**", "*"), recursive=True):
            if p.endswith(SCAN_EXT) and os.path.isfile(p):
                yield p


EXPR = r"((?<![\w.>\])])[A-Za-z_]\w*(?:\[[^\]\[]*\])?(?:\s*(?:->|\.)\s*[A-Za-z_]\w*(?:\[[^\]\[]*\])?)*)"


def calls(root, names, dry):
    pat = re.compile(EXPR + r"\s*->\s*(" + "|".join(map(re.escape, names)) + r")\s*\(")
    n = 0
    for p in files(root):
        s = read(p)
        out, pos = [], 0
        for m in pat.finditer(s):
            expr = m.group(1)
            last = re.split(r"->|\.", expr)[-1].strip()
            last = re.sub(r"\[.*\]", "", last)
            if last not in OPS_BASES:
                continue
            after = s[m.end():]
            if re.match(r"\s*" + re.escape(expr) + r"\s*->\s*be\b", after) or re.match(r"\s*be\s*[,)]", after):
                continue   # already passes the instance
            out.append(s[pos:m.end()])
            out.append(expr + "->be" + ("" if re.match(r"\s*\)", after) else ", "))
            pos = m.end()
            n += 1
        if out:
            out.append(s[pos:])
            write(p, "".join(out), dry)
    return n


def table_fns(text):
    """function names a table initializer names: `.entry = fn,`"""
    a = text.index("struct mt_ops_i ")
    a = text.index("{", a)
    b = text.index("\n};", a)
    return {m.group(1): m.group(2) for m in re.finditer(r"\.(\w+)\s*=\s*(\w+)\s*,", text[a:b]) if m.group(1) != "name"}


DECL_TYPES = r"(?:void|double|int|float|size_t|char|unsigned|long)"


def backend(root, table_file, srcs, internal_arg, dry):
    fns = sorted(set(table_fns(read(os.path.join(root, table_file))).values()), key=len, reverse=True)
    n = 0
    for p in srcs:
        s = read(p)
        orig = s
        # declarations / definitions: a type before the name
        for fn in fns:
            pos = 0
            while True:
                m = re.compile(r"\b" + DECL_TYPES + r"\b[\s\*]*\b" + re.escape(fn) + r"\s*\(").search(s, pos)
                if not m:
                    break
                op = m.end() - 1
                s, ch = add_be_param(s, op)
                end = close_paren(s, op)
                k = end
                while k < len(s) and s[k] in " \t\n":
                    k += 1
                if k < len(s) and s[k] == "{" and ch:
                    s = s[:k + 1] + "\n    (void)be;   /* stateless / not yet used (docs/cuda.md) */" + s[k + 1:]
                n += ch
                pos = end
        # direct calls (no type before the name; not the table's `= fn,`)
        for fn in fns:
            out, pos = [], 0
            for m in re.finditer(r"(?<![\w.>])" + re.escape(fn) + r"\s*\(", s):
                pre = s[max(0, m.start() - 40):m.start()]
                if re.search(r"\b" + DECL_TYPES + r"\b[\s\*]*$", pre):
                    continue
                after = s[m.end():]
                if re.match(r"\s*(be|mt_cuda_be)\s*[,)]", after):
                    continue
                out.append(s[pos:m.end()])
                out.append(internal_arg + ("" if re.match(r"\s*\)", after) else ", "))
                pos = m.end()
                n += 1
            if out:
                out.append(s[pos:])
                s = "".join(out)
        if s != orig:
            write(p, s, dry)
    return n


def rules(root, dry):
    n = 0
    for f, old, new in RULES:
        p = os.path.join(root, f)
        if not os.path.exists(p):
            problems.append("%s: file missing (rule %r)" % (f, old[:50]))
            continue
        s = read(p)
        if new in s:
            continue
        if old not in s:
            problems.append("%s: text not found, apply by hand: %r -> %r" % (f, old, new))
            continue
        # `old` may occur more than once (test_nccl_build.sh's two meshes)
        write(p, s.replace(old, new), dry)
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description="pass the backend instance to every ops-table entry")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--dry-run", action="store_true", help="report counts, write nothing (the default)")
    ap.add_argument("--apply", action="store_true",
                    help="write the rewrite (applied once already: a rerun on today's tree mangles comments "
                         "that mention a backend function, e.g. 'acc[N][4] = 0 (mt_cuda_be, N ...')")
    a = ap.parse_args()
    a.dry_run = a.dry_run or not a.apply   # writing takes --apply
    root = os.path.abspath(a.root)
    names, nh = header(root, a.dry_run)
    nc = calls(root, names, a.dry_run)
    cpu = sorted(glob.glob(os.path.join(root, "src/ops/cpu/*.c")) + glob.glob(os.path.join(root, "src/ops/cpu/*.h")))
    cu = sorted(glob.glob(os.path.join(root, "src/ops/cuda/*.cu")) + glob.glob(os.path.join(root, "src/ops/cuda/*.cuh")))
    nb = backend(root, "src/ops/cpu/ops_cpu.c", [p for p in cpu if p.endswith("ops_cpu.c")], "be", a.dry_run)
    nb += backend(root, "src/ops/cuda/ops_cuda.cu", cu, "mt_cuda_be", a.dry_run)
    nr = rules(root, a.dry_run)
    # anything still calling a table without the instance
    pat = re.compile(r"->\s*(" + "|".join(map(re.escape, names)) + r")\s*\(\s*(?!\w[\w\[\]\.>-]*->be\b|be\b)")
    left = []
    if not a.dry_run:
        for p in files(root):
            for i, line in enumerate(read(p).splitlines(), 1):
                if pat.search(line) and re.search(r"\b(" + "|".join(OPS_BASES) + r")\s*->\s*\w+\s*\(", line):
                    left.append("%s:%d: %s" % (os.path.relpath(p, root), i, line.strip()))
    print("ops_handle: %d entries; header %d changes, %d calls, %d backend signatures/calls, %d dist rules"
          % (len(names), nh, nc, nb, nr))
    for x in left:
        problems.append("call not rewritten: " + x)
    for x in problems:
        print("ops_handle: " + x, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
