#!/usr/bin/env bash
# CLI of issue 3: tokenizer train/encode/decode, prepare, sample; and every
# bad input of the issue: one line on stderr, exit 2, nothing overwritten.
set -u
BUILD=${1:?build dir}
. "$(dirname "$0")/cli_lib.sh"

mkdir -p "$W/corpus/sub" "$W/empty" "$W/bin_only"
for i in 1 2 3 4 5 6; do
  for j in $(seq 1 40); do echo "int f$i$j(int x) { return x * $j + $i; } /* caf\xc3\xa9 $j */"; done > "$W/corpus/f$i.c"
done
cp /usr/include/stdio.h "$W/corpus/sub/" 2>/dev/null || true
printf 'ab\0cd' > "$W/bin_only/blob.bin"

# tokenizer train: deterministic
$MT tokenizer train --input "$W/corpus" --vocab 400 --out "$W/tok.bin" 2>/dev/null &&
$MT tokenizer train --input "$W/corpus" --vocab 400 --out "$W/tok2.bin" 2>/dev/null &&
cmp -s "$W/tok.bin" "$W/tok2.bin" && ok "tokenizer train deterministic" || bad "tokenizer train deterministic"

# encode/decode round trip of awkward bytes (NUL, invalid UTF-8, a long line)
python3 -c "
import random,sys
r=random.Random(5); b=bytes(r.randrange(256) for _ in range(20000))+b'\x00\xff\xfe'+b'x'*50000+b'\n'
open(sys.argv[1],'wb').write(b)" "$W/odd.bin"
$MT tokenizer encode --tokenizer "$W/tok.bin" --input "$W/odd.bin" --output "$W/ids.txt" &&
$MT tokenizer decode --tokenizer "$W/tok.bin" --input "$W/ids.txt" --output "$W/back.bin" &&
cmp -s "$W/odd.bin" "$W/back.bin" && ok "encode/decode round trip" || bad "encode/decode round trip"

# prepare: shard headers and token counts agree with meta.json
if $MT prepare --input "$W/corpus" --tokenizer "$W/tok.bin" --out "$W/data" --val-frac 0.2 2>/dev/null; then
  python3 - "$W/data" <<'PY' && ok "prepare shards + meta" || bad "prepare shards + meta"
import json, os, struct, sys
d = sys.argv[1]; m = json.load(open(f"{d}/meta.json"))
tot = {"train": 0, "val": 0}
for f in sorted(os.listdir(d)):
    if not f.endswith(".bin") or f == "tokenizer.bin": continue
    b = open(f"{d}/{f}", "rb").read()
    h = struct.unpack("<256i", b[:1024])
    assert h[0] == 20240520 and h[1] == 1 and len(b) == 1024 + 2 * h[2], f
    toks = struct.unpack(f"<{h[2]}H", b[1024:])
    assert toks[0] == m["bos_id"] and max(toks) < m["vocab_size"]
    tot["val" if "val" in f else "train"] += h[2]
assert tot["train"] == m["train_tokens"] and tot["val"] == m["val_tokens"], (tot, m)
PY
else bad "prepare"; fi

# train a tiny model on it, then sample: repeatable with a seed, tokenizer checked
TINY="--set n_layer=1 --set d_model=32 --set n_head=2 --set n_kv_head=1 --set seq_len=32 --set batch_size=2"
if $MT train $TINY --data "$W/data" --out "$W/run" --steps 3 --quiet --peak-flops 1e11 2>"$W/err"; then
  # exit status checked, stdout only (stderr apart), starts with the prompt
  a=$($MT sample --ckpt "$W/run" --prompt "int f(" --tokens 20 --seed 7 2>"$W/err"); ra=$?
  b=$($MT sample --ckpt "$W/run" --prompt "int f(" --tokens 20 --seed 7 2>>"$W/err"); rb=$?
  [ $ra = 0 ] && [ $rb = 0 ] && [ "${a#int f(}" != "$a" ] && [ ${#a} -gt 6 ] && [ "$a" = "$b" ] &&
    ok "sample: exit 0, starts with the prompt, repeatable with a seed" || bad "sample repeatable (rc $ra $rb: $a $(cat "$W/err"))"
  # greedy over token ids: the prompt ids, then exactly N ids, each the argmax
  # of a full forward (meshtrain logits) over the sequence so far
  PIDS="$(printf 'int f(x) {' | $MT tokenizer encode --tokenizer "$W/data/tokenizer.bin" 2>/dev/null | tr '\n' ' ')"
  g=$($MT sample --ckpt "$W/run" --prompt-ids "$PIDS" --tokens 12 --temperature 0 2>"$W/err"); rg=$?
  if [ $rg = 0 ] && $MT logits --ckpt "$W/run" --ids "$g" --out "$W/logits.st" >/dev/null 2>>"$W/err"; then
    python3 - "$PIDS" "$g" "$W/logits.st" <<'PY' && ok "sample greedy: prompt ids + 12 ids, each the argmax of the full forward" || bad "sample greedy vs full forward ($g)"
import json, struct, sys
p = [int(x) for x in sys.argv[1].split()]; g = [int(x) for x in sys.argv[2].split()]
assert len(p) >= 2 and g[:len(p)] == p, (p, g)
assert len(g) == len(p) + 12, (len(p), len(g))
b = open(sys.argv[3], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
e = h["logits"]; T, V = e["shape"]; o = 8 + n + e["data_offsets"][0]
L = struct.unpack(f"<{T*V}f", b[o:o + 4 * T * V])
assert T == len(g)
for i in range(len(p), len(g)):          # token i was chosen from the logits at position i-1
    row = L[(i - 1) * V:i * V]
    assert g[i] == max(range(V), key=lambda v: (row[v], -v)), (i, g[i])
PY
  else bad "sample --prompt-ids / logits (rc $rg: $(cat "$W/err"))"; fi
else bad "train on prepared data ($(cat "$W/err"))"; fi

# the embedded default corpus (/usr/include) works on this machine
$MT tokenizer train --vocab 512 --max-bytes 2000000 --out "$W/deftok.bin" 2>/dev/null &&
$MT prepare --tokenizer "$W/deftok.bin" --max-bytes 2000000 --out "$W/defdata" 2>/dev/null &&
python3 -c "import json,sys; m=json.load(open(sys.argv[1])); assert m['default_corpus'] and m['files']>0 and m['train_tokens']>0" "$W/defdata/meta.json" &&
  ok "default corpus" || bad "default corpus"

# bad input: exit 2, one line, nothing overwritten
echo keep > "$W/out.bin"; mkdir -p "$W/keepdir"; echo keep > "$W/keepdir/meta.json"
expect_bad() {
  local name=$1; shift
  "$MT" "$@" >/dev/null 2>"$W/err"; local rc=$?
  local lines; lines=$(wc -l < "$W/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && [ "$(cat "$W/out.bin")" = keep ] && [ "$(cat "$W/keepdir/meta.json")" = keep ]; then
    ok "bad input: $name -> $(cat "$W/err")"; else bad "bad input: $name (rc=$rc lines=$lines: $(cat "$W/err"))"; fi
}
head -c 100 "$W/tok.bin" > "$W/trunc.bin"
python3 -c "
import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[8]=99; open(sys.argv[2],'wb').write(bytes(b))" "$W/tok.bin" "$W/badver.bin"
: > "$W/emptyfile.txt"
expect_bad "empty input"              tokenizer train --input "$W/emptyfile.txt" --vocab 300 --out "$W/out.bin"
expect_bad "dir with no text"         tokenizer train --input "$W/bin_only" --vocab 300 --out "$W/out.bin"
expect_bad "unreadable input"         tokenizer train --input "$W/nope" --vocab 300 --out "$W/out.bin"
expect_bad "vocab too small"          tokenizer train --input "$W/corpus" --vocab 100 --out "$W/out.bin"
expect_bad "vocab too large"          tokenizer train --input "$W/corpus" --vocab 70000 --out "$W/out.bin"
expect_bad "truncated tokenizer"      prepare --input "$W/corpus" --tokenizer "$W/trunc.bin" --out "$W/keepdir"
expect_bad "tokenizer other version"  prepare --input "$W/corpus" --tokenizer "$W/badver.bin" --out "$W/keepdir"
expect_bad "prepare empty dir"        prepare --input "$W/empty" --tokenizer "$W/tok.bin" --out "$W/keepdir"
$MT tokenizer train --input "$W/corpus" --vocab 300 --out "$W/tok300.bin" 2>/dev/null
expect_bad "sample tokenizer mismatch" sample --ckpt "$W/run" --prompt "x" --tokenizer "$W/tok300.bin"
expect_bad "sample bad --prompt-ids"   sample --ckpt "$W/run" --prompt-ids "1,x"
expect_bad "sample id >= vocab"        sample --ckpt "$W/run" --prompt-ids "1,65535"
expect_bad "sample prompt and ids"     sample --ckpt "$W/run" --prompt "x" --prompt-ids "1"
expect_bad "logits one id"             logits --ckpt "$W/run" --ids "1" --out "$W/l.st"

finish
