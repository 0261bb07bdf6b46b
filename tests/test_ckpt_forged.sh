#!/usr/bin/env bash
# test_ckpt_forged.sh BUILD_DIR — a manifest whose config disagrees with its
# tensors, its checksum recomputed (issue 33 item 7). Before: n_layer=1 over
# a 2-layer checkpoint resumed with rc 0, silently dropping the second
# layer's tensors, and export wrote a 1-layer model. Now every tensor of
# params.bin must be a parameter of the manifest's own config with the shape
# that config gives it (mt_ckpt_check_tensors): train --resume, export and
# logits exit 2 with one line naming the stray tensor, writing nothing. The
# other direction (n_layer=3: a parameter with no tensor) stays refused.
set -u
BUILD=${1:?usage: test_ckpt_forged.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set warmup_steps=2"
TR=("$MT" train $TINY --peak-flops 1e11 --quiet --data "$W/train.bin")
"${TR[@]}" --out "$W/run" --steps 2 >/dev/null 2>"$W/err" || { bad "base run: $(cat "$W/err")"; finish; exit 1; }
CK=$(ls -d "$W"/run/ckpt/step_* | tail -1)

# forge DIR KEY VALUE [KEY VALUE...] : set manifest config keys, restamp manifest_xxh64 (pure-python xxh64, seed 0)
forge() {
    python3 - "$1/manifest.json" "${@:2}" <<'PY'
import json, sys
M = (1 << 64) - 1
P1, P2, P3, P4, P5 = 11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579, 2870177450012600261
rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M
def rnd(a, v): return (rotl((a + v * P2) & M, 31) * P1) & M
def merge(h, v): return ((h ^ rnd(0, v)) * P1 + P4) & M
def xxh64(b):
    n, i = len(b), 0
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        while i + 32 <= n:
            for k in range(4): v[k] = rnd(v[k], int.from_bytes(b[i + 8 * k:i + 8 * k + 8], "little"))
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for k in range(4): h = merge(h, v[k])
    else: h = P5
    h = (h + n) & M
    while i + 8 <= n: h = ((rotl(h ^ rnd(0, int.from_bytes(b[i:i + 8], "little")), 27) * P1) + P4) & M; i += 8
    if i + 4 <= n: h = ((rotl(h ^ (int.from_bytes(b[i:i + 4], "little") * P1 & M), 23) * P2) + P3) & M; i += 4
    while i < n: h = (rotl(h ^ (b[i] * P5 & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = h * P2 & M; h ^= h >> 29; h = h * P3 & M; h ^= h >> 32
    return h
path, kv = sys.argv[1], sys.argv[2:]
m = json.load(open(path))
old = m.pop("manifest_xxh64")
canon = lambda o: json.dumps(o, separators=(",", ":"), ensure_ascii=False)
assert "%016x" % xxh64(canon(m).encode()) == old, "the python canonical text differs from cJSON's"
for key, val in zip(kv[::2], kv[1::2]): m["config"][key] = json.loads(val)
m["manifest_xxh64"] = "%016x" % xxh64(canon(m).encode())
json.dump(m, open(path, "w"), indent=1)
PY
}

refused() {  # NAME REGEX CMD... : exit 2, one line matching REGEX, $W/o absent
    local name=$1 re=$2; shift 2
    rm -rf "$W/o"
    timeout 60 "$@" >/dev/null 2>"$W/err"; local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -Eq "$re" "$W/err" && [ ! -e "$W/o" ]; then ok "$name: $(cat "$W/err")"
    else bad "$name (rc=$rc want 2, $W/o $([ -e "$W/o" ] && echo written || echo absent)): $(cat "$W/err")"; fi
}

rm -rf "$W/f1"; cp -r "$W/run" "$W/f1"; c1="$W/f1/ckpt/$(basename "$CK")"
forge "$c1" n_layer 1 pattern '"A"' || { bad "cannot forge"; finish; exit 1; }
refused "n_layer=1 over 2 layers: train --resume" 'model\.layers\.1\..* not a parameter' \
    "${TR[@]}" --set n_layer=1 --out "$W/o" --steps 3 --resume "$c1"
refused "n_layer=1 over 2 layers: export" 'model\.layers\.1\..* not a parameter' $MT export --ckpt "$c1" --out "$W/o"
refused "n_layer=1 over 2 layers: logits" 'model\.layers\.1\..* not a parameter' $MT logits --ckpt "$c1" --ids 1,2 --out "$W/o"

rm -rf "$W/f3"; cp -r "$W/run" "$W/f3"; c3="$W/f3/ckpt/$(basename "$CK")"
forge "$c3" n_layer 3 pattern '"AAA"'
refused "n_layer=3 over 2 layers: export" 'layers\.2' $MT export --ckpt "$c3" --out "$W/o"
refused "n_layer=3 over 2 layers: train --resume" 'layers\.2' "${TR[@]}" --set n_layer=3 --out "$W/o" --steps 3 --resume "$c3"

rm -rf "$W/fd"; cp -r "$W/run" "$W/fd"; cd_="$W/fd/ckpt/$(basename "$CK")"
forge "$cd_" mlp_hidden 64
refused "mlp_hidden forged: export" 'shape' $MT export --ckpt "$cd_" --out "$W/o"

# the untouched checkpoint exports (the restamp is the documented checksum: checked above by assert)
rm -rf "$W/o"
$MT export --ckpt "$CK" --out "$W/o" >/dev/null 2>"$W/err" && ok "the intact checkpoint exports" || bad "intact: $(cat "$W/err")"
finish
