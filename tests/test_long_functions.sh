#!/usr/bin/env bash
# test_long_functions.sh BUILD_DIR — the readability rule of
# docs/architecture.md ("Keeping it readable") as a check:
#   1. scripts/long_functions.py --self-test: its parser finds every
#      definition of tests/long_functions_fixture.c (signatures over several
#      lines, the return type on its own line, static inline one-liners,
#      braces in strings and comments, extern "C", CUDA __launch_bounds__,
#      a function returning a function pointer) with the right first line and
#      length, and nothing that is not one (structs, enums, initializers,
#      macros); the why-rule reads the comment above;
#   2. no function in src/ or tools/ is over 120 lines without a comment
#      saying why (a new one fails this test: split it into named steps, or
#      say why splitting would hurt).
set -u
BUILD=${1:?usage: test_long_functions.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
ROOT=$(cd "$HERE/.." && pwd)
command -v python3 >/dev/null 2>&1 || { echo "SKIPPED (no python3)"; exit 77; }

python3 "$ROOT/scripts/long_functions.py" --self-test >"$W/self" 2>&1 &&
    grep -Eq '^self-test: [1-9][0-9]* definition\(s\) expected, [0-9]+ found, ok$' "$W/self" &&
    ok "the parser finds every shape of the fixture" || { bad "the parser finds every shape of the fixture"; cat "$W/self"; }
(cd "$ROOT" && python3 scripts/long_functions.py src tools) >"$W/long" 2>&1 &&
    ok "no function in src/ or tools/ is over 120 lines without a why" ||
    { bad "no function in src/ or tools/ is over 120 lines without a why"; cat "$W/long"; }
finish
