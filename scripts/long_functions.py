#!/usr/bin/env python3
"""List C functions in src/ longer than a limit, and whether each says why.

Rule (docs/architecture.md, issue #14): no function in src/ is longer than
LIMIT (120) lines unless the comment just above its definition says why. A
function is a top-level definition as the project's style writes it: the
signature starts in column 0, the body opens with `{` in column 0 (or at the
end of the signature line) and closes with `}` in column 0. Its length counts
the lines from the signature's first line to the closing brace. It "says why"
when a comment ending within the 5 lines above the signature contains "why"
or "long" (case-insensitive; the whole comment counts, however many lines),
e.g. `/* Long on purpose: one pass over ... because ... */`.

Usage: scripts/long_functions.py [--limit N] [--all] [DIR ...]   (default: src)
Prints `path:line  name  lines  ok|NO-WHY`; exits 1 when some function over the
limit has no why-comment (0 otherwise), so it can run as a check.
"""
import os
import re
import sys

SIG = re.compile(r'^[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(')
KEYWORDS = {'if', 'for', 'while', 'switch', 'return', 'sizeof'}


def functions(lines):
    """Yield (name, first_line_index, last_line_index) of each definition."""
    i, n = 0, len(lines)
    while i < n:
        m = SIG.match(lines[i])
        if not m or m.group(1) in KEYWORDS or lines[i].startswith(('typedef', '#')):
            i += 1
            continue
        # the signature may span lines; find the body's `{` before any `;`
        j, body = i, None
        while j < n and j < i + 12:
            s = lines[j].rstrip()
            if s.endswith(';') and '(' not in s[-2:]:
                break
            if s == '{' or (s.endswith('{') and j == i) or (s.endswith(') {')):
                body = j
                break
            j += 1
        if body is None:
            i += 1
            continue
        k = body + 1
        while k < n and not lines[k].startswith('}'):
            k += 1
        name = m.group(1)
        if name == '__launch_bounds__':   # CUDA: `__global__ void __launch_bounds__(n) name(`
            later = re.search(r'\)\s*([A-Za-z_]\w*)\s*\(', lines[i])
            name = later.group(1) if later else name
        yield name, i, k
        i = k + 1


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


def main(argv):
    limit, show_all, dirs = 120, False, []
    it = iter(argv)
    for a in it:
        if a == '--limit':
            limit = int(next(it))
        elif a == '--all':
            show_all = True
        else:
            dirs.append(a)
    bad = 0
    rows = []
    for d in dirs or ['src']:
        for root, _, files in os.walk(d):
            for f in sorted(files):
                if not f.endswith(('.c', '.cu', '.h')):
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
