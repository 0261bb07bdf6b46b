#!/usr/bin/env bash
# test_cli_export.sh BUILD_DIR — `meshtrain import` / `meshtrain export` end to
# end: a tiny Qwen3 model written by python (BF16 embed, F32 rest, tied head)
# -> checkpoint -> safetensors; values compared in python; exit codes for
# --help (0), missing args / missing or corrupt checkpoint (2).
set -u
BUILD=${1:?usage: test_cli_export.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"
# check WANT_RC DESCRIPTION cmd... : cmd exits WANT_RC; its stdout and stderr
# stay in $W/out.txt and $W/err.txt for the checks after it
check() {
    local want=$1 what=$2; shift 2
    "$@" >"$W/out.txt" 2>"$W/err.txt"; local rc=$?
    if [ "$rc" = "$want" ]; then ok "$what: exit $rc"
    else bad "$what: exit $rc, want $want"; cat "$W/err.txt"; fi
}
[ -x "$MT" ] || fatal "no $MT"

check 0 "export --help" "$MT" export --help
grep -q -- "--ckpt" "$W/out.txt" && ok "export --help lists --ckpt" || bad "export --help lists no --ckpt"
check 0 "import --help" "$MT" import --help
check 2 "export without args" "$MT" export
check 2 "export of a missing checkpoint" "$MT" export --ckpt "$W/nope" --out "$W/x"
if [ "$(wc -l <"$W/err.txt")" = 1 ]; then ok "the error is one line"; else bad "error is not one line"; cat "$W/err.txt"; fi
check 2 "import of a missing dir" "$MT" import --hf "$W/nope" --out "$W/x"

python3 - "$W/hf" <<'EOF' || fatal "python could not build the HF dir"
import json, os, random, struct, sys
d = sys.argv[1]; os.makedirs(d)
V, D, H, K, hd, F, L = 40, 16, 2, 1, 8, 32, 2
cfg = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=V, hidden_size=D,
           intermediate_size=F, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=K,
           head_dim=hd, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=128,
           tie_word_embeddings=True, attention_bias=False, hidden_act="silu", torch_dtype="bfloat16")
json.dump(cfg, open(f"{d}/config.json", "w"))
random.seed(0)
t = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
for l in range(L):
    p = f"model.layers.{l}."
    t.update({p+"input_layernorm.weight": (D,), p+"post_attention_layernorm.weight": (D,),
              p+"self_attn.q_proj.weight": (H*hd, D), p+"self_attn.k_proj.weight": (K*hd, D),
              p+"self_attn.v_proj.weight": (K*hd, D), p+"self_attn.o_proj.weight": (D, H*hd),
              p+"self_attn.q_norm.weight": (hd,), p+"self_attn.k_norm.weight": (hd,),
              p+"mlp.gate_proj.weight": (F, D), p+"mlp.up_proj.weight": (F, D), p+"mlp.down_proj.weight": (D, F)})
hdr, blobs, off = {}, [], 0
refs = {}
for name, shape in sorted(t.items()):
    n = 1
    for x in shape: n *= x
    a = struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *[random.gauss(0, 1) for _ in range(n)]))
    if name == "model.embed_tokens.weight":   # BF16: the upper halves of f32
        u = [v >> 16 for v in struct.unpack(f"<{n}I", struct.pack(f"<{n}f", *a))]
        raw = struct.pack(f"<{n}H", *u); dt = "BF16"
        a = struct.unpack(f"<{n}f", struct.pack(f"<{n}I", *[v << 16 for v in u]))
    else:
        raw = struct.pack(f"<{n}f", *a); dt = "F32"
    hdr[name] = dict(dtype=dt, shape=list(shape), data_offsets=[off, off + len(raw)])
    blobs.append(raw); off += len(raw)
    refs[name] = raw if dt == "F32" else struct.pack(f"<{n}f", *a)
json.dump({k: v.hex() for k, v in refs.items()}, open(f"{d}/../refs.json", "w"))
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(f"{d}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
EOF

check 0 "import" "$MT" import --hf "$W/hf" --out "$W/run/ckpt/step_000000"
check 0 "export (run dir: latest checkpoint)" "$MT" export --ckpt "$W/run" --out "$W/hf2" --bos-id 1
python3 - "$W" <<'EOF' && ok "python: export matches the imported model" || bad "python: export does not match the imported model"
import json, struct, sys
T = sys.argv[1]
b = open(f"{T}/hf2/model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]; assert n % 8 == 0
h = json.loads(b[8:8+n]); data = b[8+n:]
assert h["__metadata__"]["format"] == "pt"
names = [k for k in h if k != "__metadata__"]
assert names == sorted(names), "not in name order"
refs = {k: bytes.fromhex(v) for k, v in json.load(open(f"{T}/refs.json")).items()}
refs["lm_head.weight"] = refs["model.embed_tokens.weight"]          # tied -> untied copy
assert set(names) == set(refs), set(names) ^ set(refs)
for k in names:
    e = h[k]; assert e["dtype"] == "F32"
    assert data[e["data_offsets"][0]:e["data_offsets"][1]] == refs[k], k
c = json.load(open(f"{T}/hf2/config.json"))
assert c["model_type"] == "qwen3" and c["architectures"] == ["Qwen3ForCausalLM"]
assert c["tie_word_embeddings"] is False and c["bos_token_id"] == 1 and c["max_position_embeddings"] == 128
assert c["head_dim"] == 8 and c["num_key_value_heads"] == 1 and c["intermediate_size"] == 32
print("python: export matches the imported model")
EOF

check 0 "export again over a previous export" "$MT" export --ckpt "$W/run" --out "$W/hf2"
mkdir -p "$W/foreign" && echo x >"$W/foreign/notes.txt"
check 2 "export over a foreign dir" "$MT" export --ckpt "$W/run" --out "$W/foreign"
[ -f "$W/foreign/notes.txt" ] && [ ! -e "$W/foreign/config.json" ] && ok "a refused export leaves the foreign dir as it was" ||
    bad "refused export touched the foreign dir"
check 0 "export over a foreign dir with --force" "$MT" export --ckpt "$W/run" --out "$W/foreign" --force
# --force writes only the export's own files: nothing it did not write is deleted
if [ "$(cat "$W/foreign/notes.txt" 2>/dev/null)" = x ] && [ -f "$W/foreign/model.safetensors" ]; then
    ok "export --force writes its files and keeps the others"
else bad "export --force deleted a file it did not write"; ls "$W/foreign"; fi
# a previous export: a user's file next to it survives a re-export too
echo mine >"$W/hf2/README.md"
check 0 "export again over a previous export with a user file" "$MT" export --ckpt "$W/run" --out "$W/hf2"
[ "$(cat "$W/hf2/README.md" 2>/dev/null)" = mine ] && ok "a re-export keeps README.md" || bad "re-export deleted README.md"
# --out overlapping the checkpoint: refused even with --force, and every
# checkpoint of the run is left as it was (issue 13: export --ckpt R --out R
# used to delete the run)
cp -r "$W/run" "$W/run_copy"
for o in "$W/run" "$W/run/ckpt" "$W/run/ckpt/step_000000" "$W/run/ckpt/step_000000/hf" "$W"; do
    check 2 "export --out $o overlapping the checkpoint (--force)" "$MT" export --ckpt "$W/run" --out "$o" --force
    if grep -q "overlaps" "$W/err.txt"; then ok "overlap message for $o"; else bad "overlap message for $o"; cat "$W/err.txt"; fi
done
diff -r "$W/run" "$W/run_copy" >/dev/null && ok "the refused exports left the run as it was" || bad "a refused export changed the run"
# corrupt params.bin -> exit 2, one line naming the file
printf '\x55' | dd of="$W/run/ckpt/step_000000/params.bin" bs=1 seek=100 conv=notrunc status=none
check 2 "export of a corrupt checkpoint" "$MT" export --ckpt "$W/run" --out "$W/hf3"
if grep -q "params.bin" "$W/err.txt"; then ok "the corrupt-checkpoint message names params.bin"
else bad "corrupt-checkpoint message names no file"; cat "$W/err.txt"; fi

finish
