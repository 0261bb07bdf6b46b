#!/usr/bin/env bash
# test_import_forged.sh BUILD_DIR — `meshtrain import` of forged safetensors
# (issue 33 items 2-4). The safetensors rule: the tensors' data_offsets are
# integers and, in offset order, tile the data exactly (no hole, no overlap,
# nothing left over); each name appears once. Before: 4 added to both ends of
# model.embed_tokens.weight's offsets imported with exit 0 and an embedding
# shifted by one element; overlapping, non-integer and duplicate-key headers
# were accepted too; non-finite weights exited 1; a FIFO as model.safetensors
# blocked forever. Now each exits 2 with one line naming the tensor, and no
# checkpoint is written. The untouched folder still imports (exit 0).
set -u
BUILD=${1:?usage: test_import_forged.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set warmup_steps=2"
$MT train $TINY --data "$W/train.bin" --out "$W/run" --steps 2 --quiet --peak-flops 1e11 >/dev/null 2>"$W/err" &&
    $MT export --ckpt "$W/run" --out "$W/hf" >/dev/null 2>>"$W/err" || { bad "train + export: $(cat "$W/err")"; finish; exit 1; }

# forge NAME MODE : a copy of the folder with its header (or data) forged
forge() {
    rm -rf "$W/$1"; mkdir "$W/$1"; cp "$W/hf/config.json" "$W/$1/"
    python3 - "$W/hf/model.safetensors" "$W/$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
src, dst, mode = sys.argv[1:4]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = bytearray(b[8 + n:])
E = "model.embed_tokens.weight"
names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
text = None
if mode == "shifted":            # both ends + 4: a hole at the start, an overlap at the end
    h[E]["data_offsets"] = [o + 4 for o in h[E]["data_offsets"]]
elif mode == "shifted_last":     # the last tensor shifted into 4 extra bytes: a hole only
    last = names[-1]; h[last]["data_offsets"] = [o + 4 for o in h[last]["data_offsets"]]; data += b"\0" * 4
elif mode == "overlap":          # the second tensor starts inside the first
    a, c = names[0], names[1]
    ln = h[c]["data_offsets"][1] - h[c]["data_offsets"][0]
    h[c]["data_offsets"] = [h[a]["data_offsets"][0], h[a]["data_offsets"][0] + ln]
elif mode == "fraction":         # a non-integer offset
    o = h[E]["data_offsets"]; h[E]["data_offsets"] = [o[0] + 0.5, o[1] + 0.5]
elif mode == "trailing":         # bytes after the last tensor
    data += b"\0" * 8
elif mode == "duplicate":        # the same name twice (the later one pointing at another tensor)
    other = names[0] if names[0] != E else names[1]
    body = json.dumps(h)[:-1] + ', "%s": %s}' % (E, json.dumps(h[other]))
    text = body
elif mode == "nan":              # a NaN in an F32 tensor
    for k in names:
        if h[k]["dtype"] == "F32":
            data[h[k]["data_offsets"][0]:h[k]["data_offsets"][0] + 4] = struct.pack("<f", float("nan")); break
elif mode == "inf":
    for k in names:
        if h[k]["dtype"] == "F32":
            data[h[k]["data_offsets"][0]:h[k]["data_offsets"][0] + 4] = struct.pack("<f", float("inf")); break
hb = (text if text is not None else json.dumps(h)).encode()
hb += b" " * (-len(hb) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + bytes(data))
PY
}

# refused NAME REGEX : import of $W/NAME exits 2 with one line matching REGEX, nothing written
refused() {
    rm -rf "$W/out"
    timeout 20 $MT import --hf "$W/$1" --out "$W/out" >/dev/null 2>"$W/err"; local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -Eq "$2" "$W/err" && [ ! -e "$W/out" ]; then
        ok "$1 refused: $(cat "$W/err")"
    else bad "$1 (rc=$rc want 2, out written: $([ -e "$W/out" ] && echo yes || echo no)): $(cat "$W/err")"; fi
}

for m in shifted shifted_last overlap fraction trailing duplicate nan inf; do forge "$m" "$m"; done
refused shifted 'embed_tokens.*(hole|overlap)'
refused shifted_last 'hole|cover'
refused overlap 'overlap'
refused fraction 'embed_tokens.*not two integers'
refused trailing 'cover .* bytes'
refused duplicate 'embed_tokens.weight appears twice'
refused nan 'non-finite'
refused inf 'non-finite'

# a FIFO as model.safetensors: refused at once instead of blocking in open()
rm -rf "$W/fifo"; mkdir "$W/fifo"; cp "$W/hf/config.json" "$W/fifo/"; mkfifo "$W/fifo/model.safetensors"
refused fifo 'not a regular file'

# the untouched folder still imports
rm -rf "$W/out"
$MT import --hf "$W/hf" --out "$W/out" >/dev/null 2>"$W/err" && [ -f "$W/out/manifest.json" ] &&
    ok "the exported folder imports" || bad "the exported folder: $(cat "$W/err")"
finish
