#!/usr/bin/env bash
# test_docs_config.sh BUILD_DIR — issue 32: docs/config.md is what
# scripts/gen_config_md.py makes of `meshtrain train --help` (every config key,
# its type, default, meaning and section), so the page cannot drift from the
# binary; `train --help` prints its config-keys heading once.
# Regenerate: python3 scripts/gen_config_md.py build/meshtrain > docs/config.md
set -u
BUILD=${1:?usage: test_docs_config.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
ROOT=$(cd "$HERE/.." && pwd)
python3 "$ROOT/scripts/gen_config_md.py" "$MT" >"$W/config.md"
if diff -u "$ROOT/docs/config.md" "$W/config.md" >"$W/diff"; then ok "docs/config.md matches train --help"
else bad "docs/config.md differs from train --help (regenerate it)"; head -30 "$W/diff"; fi
n_help=$("$MT" train --help | awk '/^config keys \(/{on=1; next} on && /^  [a-z_0-9]+ +(int|float|string|bool|u64) /{n++} END{print n+0}')
n_doc=$(grep -c '^| `' "$ROOT/docs/config.md")
[ "$n_help" -gt 40 ] && [ "$n_help" -eq "$n_doc" ] && ok "every key documented ($n_doc)" || bad "keys: help $n_help, docs $n_doc"
[ "$("$MT" train --help | grep -c '^config keys')" -eq 1 ] && ok "train --help: one config-keys heading" \
    || bad "train --help: config-keys heading printed more than once"
"$MT" --version | grep -Eq '^meshtrain \S+ \(' && ok "meshtrain --version" || bad "meshtrain --version"
"$MT" export --help | grep -q -- '--merge' && "$MT" export --help | grep -q -- '--adapter' && ok "export usage lists --merge/--adapter" \
    || bad "export usage lacks --merge/--adapter"
finish
