#!/usr/bin/env python3
"""List C functions in src/ and tools/ longer than a limit, and whether each says why.

Rule (docs/architecture.md, issue #14): no function in src/ or tools/ is
longer than LIMIT (120) lines unless the comment just above its definition
says why. A function is every definition the compiler sees at file scope (or
inside `extern "C" { }` / a namespace): whatever its layout — a signature
split over lines, the return type on its own line, `static inline` in a
header, the body's `{` on the signature's line or its own, a CUDA
`__global__ void __launch_bounds__(n) name(` kernel, an attribute between the
parameters and the body. Its length counts the lines from the signature's
first line (the first token after the previous declaration, comment or
preprocessor line) to the closing brace. It "says why" when a comment ending
within the 5 lines above the signature contains "why" or "long"
(case-insensitive; the whole comment counts, however many lines), e.g.
`/* Long on purpose: one pass over ... because ... */`.

How it parses (no compiler needed): comments, string and character literals
and preprocessor lines (with their continuations) are blanked, keeping line
breaks; then each `{` at file scope opens a definition when the text since the
previous `;`, `}` or `{` at file scope ends with a parenthesised parameter list
(plus optional attributes or qualifiers) and holds no `=` (an initializer)
— that rules out structs, enums, arrays and `extern "C"`. The name is the
identifier before that parameter list.

Usage: scripts/long_functions.py [--limit N] [--all] [DIR ...]   (default: src tools)
       scripts/long_functions.py --self-test   (tests/long_functions_fixture.c)
Prints `path:line  name  lines  ok|NO-WHY`; exits 1 when some function over the
limit has no why-comment (0 otherwise), so it can run as a check (ctest
test_long_functions).
"""
import os
import re
import sys

EXTS = ('.c', '.cu', '.h', '.cuh')
IDENT = re.compile(r'[A-Za-z_]\w*')
# what may stand between a definition's parameter list and its `{`
TRAILER = re.compile(r'(\s|__attribute__\s*\(\(.*?\)\)|\b(const|noexcept|override|__restrict__)\b)*$', re.S)
NOT_A_NAME = {'if', 'for', 'while', 'switch', 'return', 'sizeof', '__attribute__', '__launch_bounds__',
              'alignas', '_Alignas', 'decltype', '__declspec'}


def blank(text):
    """text with comments, string/char literals and preprocessor lines turned
    into spaces (line breaks kept, so offsets and line numbers still match)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in ' \t':
            i += 1
            continue
        if line_start and c == '#':
            # a preprocessor line, with its backslash continuations
            j = i
            while j < n and text[j] != '\n':
                if text[j] == '\\' and j + 1 < n and text[j + 1] == '\n':
                    j += 2
                    continue
                if text.startswith('/*', j):   # a comment inside a directive may span lines
                    e = text.find('*/', j + 2)
                    j = n if e < 0 else e + 2
                    continue
                j += 1
            for k in range(i, j):
                if out[k] != '\n':
                    out[k] = ' '
            i = j
            continue
        line_start = False
        if c == '\n':
            line_start = True
            i += 1
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = ' '
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != '\n':
                    out[k] = ' '
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            for k in range(i + 1, min(j, n)):
                out[k] = ' '
            i = j + 1
        else:
            i += 1
    return ''.join(out)


def definition_name(head, inner=False):
    """The function name if `head` (the file-scope text before a `{`) is a
    function signature, else None."""
    if '=' in head.replace('==', '').replace('!=', '').replace('<=', '').replace('>=', ''):
        return None
    m = TRAILER.search(head)
    core = head[:m.start()] if m else head
    if not core.endswith(')'):
        return None
    depth, i = 0, len(core) - 1
    while i >= 0:   # back to the `(` that opens the parameter list
        if core[i] == ')':
            depth += 1
        elif core[i] == '(':
            depth -= 1
            if depth == 0:
                break
        i -= 1
    if i < 0:
        return None
    before = core[:i].rstrip()
    if before.endswith(')'):   # a function returning a function pointer: `int (*pick(int k))(int)`
        return definition_name(before[before.index('(') + 1:-1].strip(), True) if '(' in before else None
    m = re.search(r'([A-Za-z_]\w*)$', before)
    if not m or m.group(1) in NOT_A_NAME:
        return None
    if not inner and not IDENT.search(before[:m.start()]):   # a bare `name(...) {`: a macro call, not a definition
        return None
    return m.group(1)


def functions(lines):
    """Yield (name, first_line_index, last_line_index) of each definition."""
    text = '\n'.join(lines)
    code = blank(text)
    line_of = []
    ln = 0
    for ch in code:
        line_of.append(ln)
        if ch == '\n':
            ln += 1
    depth = 0          # brace depth, not counting transparent scopes
    stack = []         # per open brace: 'fn' (a definition), 'scope' (extern "C"/namespace), 'other'
    head_start = 0     # where the current file-scope declaration began
    fn_start = fn_name = None
    for i, ch in enumerate(code):
        if ch == '{':
            if depth == 0:
                head = code[head_start:i]
                raw = text[head_start:i]
                name = definition_name(head.strip())
                if name:
                    stack.append('fn')
                    depth += 1
                    s = head_start + (len(head) - len(head.lstrip()))
                    fn_start, fn_name = s, name
                elif re.search(r'\bextern\s*"\s*"\s*$', head) and '"C"' in raw or re.search(r'\bnamespace\b', head):
                    stack.append('scope')   # its contents are at file scope
                    head_start = i + 1
                else:
                    stack.append('other')
                    depth += 1
            else:
                stack.append('other')
                depth += 1
        elif ch == '}':
            kind = stack.pop() if stack else 'other'
            if kind == 'scope':
                head_start = i + 1
                continue
            depth -= 1
            if depth == 0:
                if kind == 'fn':
                    yield fn_name, line_of[fn_start], line_of[i]
                head_start = i + 1
        elif ch == ';' and depth == 0:
            head_start = i + 1


def says_why(lines, first):
    """The comment that ends within the 5 lines above `first` (the whole
    comment, however many lines it spans) names "why" or "long"."""
    end = None
    for j in range(first - 1, max(-1, first - 6), -1):
        if '*/' in lines[j] or lines[j].lstrip().startswith('//'):
            end = j
            break
    if end is None:
        return False
    start = end
    if '*/' in lines[end]:
        while start > 0 and '/*' not in lines[start]:
            start -= 1
    else:
        while start > 0 and lines[start - 1].lstrip().startswith('//'):
            start -= 1
    text = ' '.join(lines[start:end + 1]).lower()
    return 'why' in text or 'long' in text


def self_test():
    """Parse the fixture and compare with the `// EXPECT name first length`
    lines of its header: every definition found, nothing else, the right
    first lines and lengths, and the why-rule on its two long functions."""
    here = os.path.dirname(os.path.abspath(__file__))
    p = os.path.join(here, '..', 'tests', 'long_functions_fixture.c')
    with open(p, encoding='utf-8') as fh:
        lines = fh.read().split('\n')
    want = []
    for s in lines:
        m = re.match(r'\s*// EXPECT (\w+) (\d+) (\d+)(?: (why|no-why))?\s*$', s)
        if m:
            want.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)))
    got = [(name, a + 1, b - a + 1) for name, a, b in functions(lines)]
    bad = 0
    if [w[:3] for w in want] != got:
        bad += 1
        print('FAIL parse: want %s\n           got  %s' % ([w[:3] for w in want], got))
    for name, first, _, why in want:
        if why and says_why(lines, first - 1) != (why == 'why'):
            bad += 1
            print('FAIL says_why(%s) != %s' % (name, why))
    print('self-test: %d definition(s) expected, %d found, %s' % (len(want), len(got), 'ok' if not bad else 'FAILED'))
    return 1 if bad or not want else 0


def main(argv):
    limit, show_all, dirs = 120, False, []
    it = iter(argv)
    for a in it:
        if a == '--limit':
            limit = int(next(it))
        elif a == '--all':
            show_all = True
        elif a == '--self-test':
            return self_test()
        else:
            dirs.append(a)
    bad = 0
    rows = []
    for d in dirs or ['src', 'tools']:
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for f in sorted(files):
                if not f.endswith(EXTS):
                    continue
                p = os.path.join(root, f)
                with open(p, encoding='utf-8', errors='replace') as fh:
                    lines = fh.read().split('\n')
                for name, a, b in functions(lines):
                    length = b - a + 1
                    if length <= limit and not show_all:
                        continue
                    ok = length <= limit or says_why(lines, a)
                    bad += not ok
                    rows.append((length, '%s:%d  %s  %d  %s' % (p, a + 1, name, length, 'ok' if ok else 'NO-WHY')))
    for _, r in sorted(rows, reverse=True):
        print(r)
    print('%d function(s) over %d lines without a why-comment' % (bad, limit))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
