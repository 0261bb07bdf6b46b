#!/usr/bin/env bash
# test_special_files.sh BUILD_DIR — special files and named checkpoint
# folders (issue 33 items 3 and 5), one rank. Before: `train --config
# /dev/zero` grew to GBs and never exited; a FIFO as --config, --data, or as
# a checkpoint's params.bin / manifest.json blocked forever in open() (train
# --resume, export, logits); `--resume OUT/ckpt/step_N`, `logits` and
# `export` on a checkpoint folder skipped the tokenizer.bin checksum that
# `--resume OUT` checks. Now every input is opened as a regular file only
# (O_NONBLOCK + fstat before a byte is read), config files are at most
# 16 MiB, and a named checkpoint folder gets the same validation as one
# found through OUT: each case exits 2 within 20 s with one line naming the
# file, and nothing is written.
set -u
BUILD=${1:?usage: test_special_files.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

mkdir -p "$W/data"
python3 "$HERE/make_shard.py" "$W/data/train.bin" 20000 64 pattern >/dev/null
head -c 3000 /dev/urandom >"$W/data/tokenizer.bin"   # travels with the checkpoint (content opaque here)
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set warmup_steps=2"
P="--peak-flops 1e11 --quiet"
$MT train $TINY $P --data "$W/data/train.bin" --out "$W/run" --steps 2 >/dev/null 2>"$W/err" || { bad "base run: $(cat "$W/err")"; finish; exit 1; }
CK=$(ls -d "$W"/run/ckpt/step_* | tail -1)

# refused NAME REGEX NOT_CREATED CMD... : exit 2 within 20 s, one line on stderr matching REGEX, NOT_CREATED absent
refused() {
    local name=$1 re=$2 out=$3; shift 3
    rm -rf "$out"
    local t0=$SECONDS
    timeout 20 "$@" >/dev/null 2>"$W/err" </dev/null; local rc=$? dt=$((SECONDS - t0))
    if [ $rc -eq 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -Eq "$re" "$W/err" && [ ! -e "$out" ]; then
        ok "$name: exit 2 in ${dt}s: $(cat "$W/err")"
    else bad "$name (rc=$rc want 2, ${dt}s, $out $([ -e "$out" ] && echo written || echo absent)): $(cat "$W/err")"; fi
}
TR=("$MT" train $TINY $P)

# ---- item 3: special files ----
refused "--config /dev/zero" 'not a regular file' "$W/o" "${TR[@]}" --config /dev/zero --data "$W/data/train.bin" --out "$W/o" --steps 1
mkfifo "$W/fifo"
refused "--config FIFO" 'fifo.*not a regular file' "$W/o" "${TR[@]}" --config "$W/fifo" --data "$W/data/train.bin" --out "$W/o" --steps 1
python3 -c "import sys; open(sys.argv[1],'w').write('{\"seed\": 1' + ' ' * (17 << 20) + '}')" "$W/big.json"
refused "--config of 17 MiB" 'bytes \(at most' "$W/o" "${TR[@]}" --config "$W/big.json" --data "$W/data/train.bin" --out "$W/o" --steps 1
refused "--data FIFO" 'fifo.*(not a regular file|neither a file nor a directory)' "$W/o" "${TR[@]}" --data "$W/fifo" --out "$W/o" --steps 1
refused "plan --config FIFO" 'not a regular file' "$W/o" $MT plan --config "$W/fifo"

# a checkpoint whose params.bin, then manifest.json, is a FIFO
for f in params.bin manifest.json; do
    rm -rf "$W/ff"; cp -r "$W/run" "$W/ff"; c="$W/ff/ckpt/$(basename "$CK")"
    rm "$c/$f"; mkfifo "$c/$f"
    refused "$f a FIFO: train --resume OUT" 'not a regular file' "$W/o" \
        "${TR[@]}" --data "$W/data/train.bin" --out "$W/o" --steps 3 --resume "$W/ff"
    refused "$f a FIFO: train --resume OUT/ckpt/step_N" 'not a regular file' "$W/o" \
        "${TR[@]}" --data "$W/data/train.bin" --out "$W/o" --steps 3 --resume "$c"
    refused "$f a FIFO: export" 'not a regular file' "$W/o" $MT export --ckpt "$c" --out "$W/o"
    refused "$f a FIFO: logits" 'not a regular file' "$W/o" $MT logits --ckpt "$c" --ids 1,2,3 --out "$W/o"
done

# ---- item 5: a damaged tokenizer.bin, whichever folder is named ----
rm -rf "$W/tb"; cp -r "$W/run" "$W/tb"; c="$W/tb/ckpt/$(basename "$CK")"
printf 'x' >>"$c/tokenizer.bin"
refused "tokenizer.bin damaged: train --resume OUT" 'tokenizer\.bin' "$W/o" \
    "${TR[@]}" --data "$W/data/train.bin" --out "$W/o" --steps 3 --resume "$W/tb"
refused "tokenizer.bin damaged: train --resume OUT/ckpt/step_N" 'tokenizer\.bin' "$W/o" \
    "${TR[@]}" --data "$W/data/train.bin" --out "$W/o" --steps 3 --resume "$c"
refused "tokenizer.bin damaged: logits --ckpt step_N" 'tokenizer\.bin' "$W/o" $MT logits --ckpt "$c" --ids 1,2,3 --out "$W/o"
refused "tokenizer.bin damaged: export --ckpt step_N" 'tokenizer\.bin' "$W/o" $MT export --ckpt "$c" --out "$W/o"

# the intact checkpoint still resumes by either name, and runs logits
"${TR[@]}" --data "$W/data/train.bin" --out "$W/r1" --steps 3 --resume "$CK" >/dev/null 2>"$W/err" &&
    "${TR[@]}" --data "$W/data/train.bin" --out "$W/r2" --steps 3 --resume "$W/run" >/dev/null 2>>"$W/err" &&
    $MT logits --ckpt "$CK" --ids 1,2,3 --out "$W/l.safetensors" >/dev/null 2>>"$W/err" &&
    ok "intact checkpoint: resume (folder and OUT), logits" ||
    bad "intact checkpoint: $(cat "$W/err")"
finish
