#!/usr/bin/env bash
# test_cli_messages.sh BUILD_DIR — issue 13 item 8 (messages): every refusal
# of a config file or an option is ONE line on stderr, exit 2, names the file
# and the place, and writes nothing:
#  - a JSON syntax error: "FILE: config: invalid JSON at line L, column C ...";
#  - trailing text after the object, a duplicate key, text after a NUL byte:
#    refused (cJSON alone accepts all three silently);
#  - an unknown option, even as the last argument, is "unknown option", not
#    "needs a value" (train, sample, plan, logits, prepare, tokenizer: one
#    checker, mt_cmd_option); a known one without its value still "needs a
#    value".
#  - `logits --backend`: a value other than cpu|cuda is refused (exit 2);
#    cuda in a build without CUDA is refused with train's message and exit
#    code (1: MT_ERR_UNSUPPORTED), one line, before reading the checkpoint,
#    writing nothing.
#  - MT_ERROR_WHERE=1 appends where the error was raised, still one line;
#    without it the line has no file:line.
set -u
BUILD=${1:?usage: test_cli_messages.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

# refuse NAME REGEX CMD... : exit 2 (RC=n refuse ...: exit n), exactly one stderr line matching REGEX,
# $W/out not created
refuse() {
    local name=$1 expect=$2 want=${RC:-2}; shift 2
    rm -rf "$W/out"
    "$@" >"$W/stdout" 2>"$W/stderr"
    local rc=$? nl
    nl=$(wc -l <"$W/stderr")
    if [ $rc -eq "$want" ] && [ "$nl" -eq 1 ] && grep -Eq -e "$expect" "$W/stderr" && [ ! -e "$W/out" ]; then ok "$name"
    else bad "$name (rc=$rc, $nl lines)"; cat "$W/stderr"; fi
}

printf '{\n  "n_layer": 2,\n  "n_head" 4,\n  "d_model": 64\n}\n' >"$W/syntax.json"
printf '{"n_layer": 2}\n  garbage\n' >"$W/trailing.json"
printf '{"seed": 1,\n "lr": 0.1,\n "seed": 2}\n' >"$W/dup.json"
printf '{"n_layer": 2}\0{"n_layer": 3}' >"$W/nul.json"
TRAIN=("$MT" train --data "$W/none.bin" --out "$W/out" --quiet)

refuse "JSON syntax error: one line with file, line and column" \
    '^meshtrain train: .*/syntax\.json: config: invalid JSON at line 3, column 12 \(offset 29\)' \
    "${TRAIN[@]}" --config "$W/syntax.json"
refuse "trailing text after the JSON object is refused" \
    'trailing\.json: config: trailing text after the JSON object at line 2, column 3' \
    "${TRAIN[@]}" --config "$W/trailing.json"
refuse "a duplicate config key is refused" \
    "dup\.json: config: duplicate config key 'seed'" "${TRAIN[@]}" --config "$W/dup.json"
# MT_ERROR_WHERE=1 (src/core/core.c): the same one line, plus where the error
# was raised (" [src/...:N]"; a message that quotes an earlier one keeps that
# one's place first: origin, then the wrapper)
refuse "MT_ERROR_WHERE=1: the same line, with file:line" \
    "dup\.json: config: duplicate config key 'seed'( \[src/[a-z_/]+\.c:[0-9]+\])+$" \
    env MT_ERROR_WHERE=1 "${TRAIN[@]}" --config "$W/dup.json"
refuse "without MT_ERROR_WHERE: no file:line" "dup\.json: config: duplicate config key 'seed'$" \
    "${TRAIN[@]}" --config "$W/dup.json"
refuse "text after a NUL byte is refused" \
    'nul\.json: config: NUL byte at offset 14' "${TRAIN[@]}" --config "$W/nul.json"
# the same refusals through `plan`, which shares the loader
refuse "plan: duplicate config key" "dup\.json: config: duplicate config key 'seed'" \
    "$MT" plan --config "$W/dup.json"

refuse "train: an unknown last option is unknown" "^meshtrain train: unknown option '--bogus'" \
    "${TRAIN[@]}" --bogus
refuse "train: an unknown option with a value is unknown" "^meshtrain train: unknown option '--bogus'" \
    "${TRAIN[@]}" --bogus 3
refuse "train: a known option without value needs a value" "^meshtrain train: --steps needs a value" \
    "${TRAIN[@]}" --steps
refuse "sample: an unknown last option is unknown" "^meshtrain sample: unknown option '--bogus'" \
    "$MT" sample --ckpt "$W/none" --bogus
refuse "sample: a known option without value needs a value" "^meshtrain sample: --prompt needs a value" \
    "$MT" sample --ckpt "$W/none" --prompt
# the other tools share the checker (tools/meshtrain.c mt_cmd_option)
refuse "plan: an unknown last option is unknown" "^meshtrain plan: unknown option '--bogus'" "$MT" plan --json --bogus
refuse "plan: --knob with an unknown name" "^meshtrain plan: --knob 'nope': unknown knob" "$MT" plan --knob nope=1
refuse "plan: --knob with a bad value" "^meshtrain plan: --knob scan_bf16: expected 0 or 1 \(got '7'\)$" \
    "$MT" plan --knob scan_bf16=7
refuse "logits: a known option without value needs a value" "^meshtrain logits: --ckpt needs a value" \
    "$MT" logits --ckpt
refuse "logits: --backend foo is refused" "^meshtrain logits: --backend expects cpu or cuda \(got 'foo'\)$" \
    "$MT" logits --ckpt "$W/none" --ids 1,2 --out "$W/out" --backend foo
if grep -q '^MT_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "NOTE: a CUDA build: logits --backend cuda without CUDA not checked here (tests/test_cuda_build.sh runs it)"
else
    # the same lookup as train's (mt_ops_by_name): its message and exit code
    RC=1 refuse "logits: --backend cuda in a build without CUDA is refused as train refuses it" \
        "^meshtrain logits: backend 'cuda' is not available: built without CUDA \(use backend=cpu\)$" \
        "$MT" logits --ckpt "$W/none" --ids 1,2 --out "$W/out" --backend cuda
fi
refuse "prepare: an unknown option is unknown" "^meshtrain prepare: unknown option '--bogus'" \
    "$MT" prepare --out "$W/out" --bogus
refuse "prepare: a known option without value needs a value" "^meshtrain prepare: --out needs a value" \
    "$MT" prepare --tokenizer "$W/none.bin" --out
refuse "tokenizer train: a known option without value needs a value" "^meshtrain tokenizer: --out needs a value" \
    "$MT" tokenizer train --out
refuse "tokenizer decode: --bos is an encode flag" "^meshtrain tokenizer: unknown option '--bos'" \
    "$MT" tokenizer decode --tokenizer "$W/none.bin" --bos

finish
