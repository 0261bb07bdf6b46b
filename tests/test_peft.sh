#!/usr/bin/env bash
# test_peft.sh BUILD_DIR — LoRA adapters in the PEFT format, both ways, with
# no torch (issue 34; docs/lora.md "PEFT layouts", "Import"). On a dense and a
# mixed (pattern=AE) model, and an all-MoE one (EE):
#   - export --adapter: adapter_config.json (r, alpha, base_model_name_or_path
#     from --base-name or the Hugging Face base folder, target_modules: a list,
#     or on the mixed model a regex that PEFT's fullmatch applies to exactly
#     the modules that have tensors, dense MLP and experts apart) and the
#     adapter math from the files alone: numpy W + (alpha/r) B A from the
#     base's safetensors and the adapter equals `export --merge`, and the numpy
#     reference forward (tests/hf/ref_forward.py) of those merged weights
#     equals `meshtrain logits` of the LoRA run;
#   - import: `train --init-from BASE --lora-from ADAPTER --steps 0` gives the
#     LoRA run's logits bit for bit, its --adapter export is the same file
#     (byte-identical adapter tensors), training continues from it, and
#     logits / export work from the result; the base may be the Hugging Face
#     folder (the adapter names it); on tp=2 and ep=2 (2 ranks, when MPI is
#     built in) too;
#   - transformers 5's layout (--hf-layout 5, or the default where the
#     installed transformers is 5 and one file cannot serve both): the fused
#     experts hold the per-expert adapters bit for bit (peft 0.21's
#     conversion), the dense MLP goes by target_parameters; imported back
#     bit-identical (logits, re-export);
#   - refusals (exit 2, one line, nothing written): a bad --hf-layout, --base-name
#     without --adapter; --lora-from without --init-from, with --resume, with
#     --lora, lora_dropout, bias, use_dora, use_rslora, rank_pattern,
#     layers_to_transform, an unsupported target module, a tensor of another
#     module (lm_head), the experts' gate only, another base shape, another
#     peft_type, a missing file, a fused gate_up adapter mixing gate and up.
# The numpy parts skip (exit 77 when nothing failed) without numpy.
set -u
BUILD=${1:?usage: test_peft.sh BUILD_DIR}
source "$(dirname "$0")/cli_lib.sh"
export HERE
PY=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy" 2>/dev/null; then PY=$p; break; fi
done
export MT_HF_PYTHON=/nonexistent   # the default layout must not depend on this machine's transformers

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
DENSE="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set warmup_steps=2"
MOE="--set n_experts=4 --set top_k=2 --set expert_hidden=32"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"
IDS="1,5,9,2,33,7,12,60,3,3,18,41"
tr() { "$MT" train $COMMON "$@" >"$W/log" 2>&1; }

# kind pattern lora-targets
for row in "dense AA q,k,v,o,gate,up,down" "mixed AE q,v,gate,up,down,expert" "moe EE q,k,expert"; do
    set -- $row; k=$1; pat=$2; tg=$3
    extra="--set pattern=$pat"; [ $pat != AA ] && extra="$extra $MOE"
    if ! tr $DENSE $extra --steps 4 --out "$W/$k.base" ||
       ! "$MT" export --ckpt "$W/$k.base" --out "$W/$k.hf" >/dev/null 2>&1 ||
       ! tr $DENSE $extra --init-from "$W/$k.hf" --lora 4:8:$tg --steps 6 --set lr=0.03 --out "$W/$k.lora"; then
        bad "$k: base / LoRA run"; cat "$W/log"; continue; fi
    "$MT" export --ckpt "$W/$k.lora" --out "$W/$k.ad" --adapter >"$W/$k.ad.out" 2>"$W/$k.ad.err" &&
    "$MT" export --ckpt "$W/$k.lora" --out "$W/$k.named" --adapter --base-name org/base-7b >/dev/null 2>&1 &&
    "$MT" export --ckpt "$W/$k.lora" --out "$W/$k.merged" --merge >/dev/null 2>&1 &&
    "$MT" logits --ckpt "$W/$k.lora" --ids "$IDS" --out "$W/$k.logits" >/dev/null 2>&1 ||
        { bad "$k: export --adapter / --merge / logits"; cat "$W/$k.ad.err"; continue; }
    grep -q "adapter layout: transformers" "$W/$k.ad.out" && ok "$k: export --adapter says its layout ($(head -1 "$W/$k.ad.out"))" ||
        bad "$k: no layout line"
    # the config: base name, r, alpha, target_modules (PEFT's matching, emulated)
    if python3 - "$W/$k.ad" "$W/$k.named" "$W/$k.hf" "$pat" <<'PY'
import json, re, struct, sys, os
ad, named, hf, pat = sys.argv[1:]
c, n = json.load(open(f"{ad}/adapter_config.json")), json.load(open(f"{named}/adapter_config.json"))
assert c["base_model_name_or_path"] == os.path.realpath(hf), c["base_model_name_or_path"]
assert n["base_model_name_or_path"] == "org/base-7b"
assert c["r"] == 4 and c["lora_alpha"] == 8 and c["peft_type"] == "LORA" and c["lora_dropout"] == 0
b = open(f"{ad}/adapter_model.safetensors", "rb").read()
names = [k for k in json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]]) if k != "__metadata__"]
have = {k[len("base_model.model."):].rsplit(".lora_", 1)[0] for k in names}
# every Linear module of the HF model (transformers 4 names)
E = 4; mods = []
for l, kind in enumerate(pat):
    mods += [f"model.layers.{l}.self_attn.{p}_proj" for p in "qkvo"]
    if kind == "A": mods += [f"model.layers.{l}.mlp.{p}_proj" for p in ("gate", "up", "down")]
    else:
        mods.append(f"model.layers.{l}.mlp.gate")
        mods += [f"model.layers.{l}.mlp.experts.{e}.{p}_proj" for e in range(E) for p in ("gate", "up", "down")]
tm = c["target_modules"]
if isinstance(tm, str): hit = {m for m in mods if re.fullmatch(tm, m)}
else: hit = {m for m in mods if any(m == t or m.endswith("." + t) for t in tm)}
assert hit == have, (sorted(hit ^ have), tm)
assert isinstance(tm, str) == (pat == "AE"), tm
print(f"   target_modules {tm if isinstance(tm, str) else ','.join(tm)}: {len(have)} modules")
PY
    then ok "$k: adapter_config.json (base_model_name_or_path, r, alpha; target_modules adapts exactly the modules with tensors)"
    else bad "$k: adapter_config.json"; fi
    if [ -n "$PY" ]; then
        "$PY" - "$W/$k.ad" "$W/$k.hf" "$W/$k.merged" "$W/$k.numpy" <<'PY' &&
import json, os, shutil, struct, sys
import numpy as np
sys.path.insert(0, os.environ["HERE"] + "/hf")
from ref_forward import load_safetensors
ad, hf, merged, out = sys.argv[1:]
c = json.load(open(f"{ad}/adapter_config.json"))
s = c["lora_alpha"] / c["r"]
A = load_safetensors(f"{ad}/adapter_model.safetensors")
W = load_safetensors(f"{hf}/model.safetensors"); M = load_safetensors(f"{merged}/model.safetensors")
n, worst = 0, 0.0
for k, a in A.items():
    if ".lora_A." not in k: continue
    mod = k[len("base_model.model."):].rsplit(".lora_A.", 1)[0]
    bm = A[k.replace(".lora_A.", ".lora_B.")]
    W[mod + ".weight"] = W[mod + ".weight"] + s * (bm @ a)   # (out, r) (r, in)
    worst = max(worst, float(np.max(np.abs(W[mod + ".weight"] - M[mod + ".weight"])))); n += 1
assert set(W) == set(M) and n > 0
for k in W:
    if np.max(np.abs(W[k] - M[k])) > 1e-6: raise SystemExit(f"{k}: numpy merge differs from export --merge")
# the numpy-merged folder for the reference forward
os.makedirs(out, exist_ok=True); shutil.copy(f"{hf}/config.json", out)
hdr, off, blobs = {}, 0, []
for k in sorted(W):
    x = W[k].astype("<f4").tobytes(); hdr[k] = {"dtype": "F32", "shape": list(W[k].shape), "data_offsets": [off, off + len(x)]}
    off += len(x); blobs.append(x)
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(f"{out}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(f"   {n} adapted matrices, numpy merge vs export --merge max |diff| {worst:.3g}")
PY
        HERE=$HERE "$PY" "$HERE/hf/ref_forward.py" compare "$W/$k.numpy" "$W/$k.logits" "$IDS" --atol 2e-5 >"$W/ref.log" 2>&1 &&
            ok "$k: numpy adapter math from the files alone (W + s B A == export --merge; its forward == meshtrain logits: $(grep -o 'max.*' "$W/ref.log" | head -1))" ||
            { bad "$k: numpy adapter math"; cat "$W/ref.log"; }
    fi
    # import: the adapter back onto its base, from the HF folder the config names
    if tr $DENSE --init-from "$W/$k.hf" --lora-from "$W/$k.ad" --steps 0 --out "$W/$k.imp" &&
       "$MT" logits --ckpt "$W/$k.imp" --ids "$IDS" --out "$W/$k.imp.logits" >/dev/null 2>&1 &&
       cmp -s "$W/$k.logits" "$W/$k.imp.logits" &&
       "$MT" export --ckpt "$W/$k.imp" --out "$W/$k.ad2" --adapter >/dev/null 2>&1 &&
       cmp -s "$W/$k.ad/adapter_model.safetensors" "$W/$k.ad2/adapter_model.safetensors" &&
       cmp -s "$W/$k.ad/adapter_config.json" "$W/$k.ad2/adapter_config.json"; then
        ok "$k: --lora-from imports the adapter: logits bit-identical to the LoRA run's, re-export byte-identical"
    else bad "$k: --lora-from round trip"; cat "$W/log"; fi
    # continue training from it; logits and export of the result
    if tr $DENSE --init-from "$W/$k.hf" --lora-from "$W/$k.ad" --steps 3 --out "$W/$k.cont" &&
       "$MT" logits --ckpt "$W/$k.cont" --ids "$IDS" --out "$W/$k.cont.logits" >/dev/null 2>&1 &&
       "$MT" export --ckpt "$W/$k.cont" --out "$W/$k.ad3" --adapter >/dev/null 2>&1 &&
       ! cmp -s "$W/$k.ad/adapter_model.safetensors" "$W/$k.ad3/adapter_model.safetensors" &&
       python3 - "$W/$k.cont" "$W/$k.lora" <<'PY'
import json, sys
c, l = (json.load(open(d + "/receipt.json")) for d in sys.argv[1:])
assert c["config"]["lora_rank"] == 4 and c["config"]["lora_alpha"] == 8, c["config"]
assert c["parameters"]["trainable"] == l["parameters"]["trainable"]
PY
    then ok "$k: training continues from the imported adapter (rank, alpha, targets from its config); logits / export of the result"
    else bad "$k: continue from the imported adapter"; cat "$W/log"; fi
done

# ---- refusals: exit 2, one line, nothing written ----
refuse() { # refuse WHAT OUTDIR cmd...
    local what=$1 out=$2; shift 2
    "$@" >"$W/r.out" 2>"$W/r.err"; local rc=$?
    if [ $rc = 2 ] && [ "$(wc -l <"$W/r.err")" = 1 ] && [ ! -e "$out" ]; then ok "refused: $what ($(sed "s|$W/||g" "$W/r.err"))"
    else bad "$what: exit $rc (want 2, one line, nothing written)"; cat "$W/r.err"; fi
}
# ---- the import under a mesh: each rank loads its boxes of the adapters (resharded like any checkpoint) ----
if command -v mpirun >/dev/null 2>&1 && grep -q '^MT_WITH_MPI:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    for mesh in tp=2 ep=2; do
        if OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun --oversubscribe --allow-run-as-root -np 2 \
               "$MT" train $COMMON $DENSE --mesh $mesh --init-from "$W/mixed.hf" --lora-from "$W/mixed.ad" --steps 0 \
               --out "$W/mixed.$mesh" >"$W/log" 2>&1 </dev/null &&
           "$MT" logits --ckpt "$W/mixed.$mesh" --ids "$IDS" --out "$W/mixed.$mesh.logits" >/dev/null 2>&1 &&
           cmp -s "$W/mixed.logits" "$W/mixed.$mesh.logits"; then
            ok "mixed: --lora-from on $mesh (2 ranks): the checkpoint's logits bit-identical to the LoRA run's"
        else bad "mixed: --lora-from on $mesh"; cat "$W/log"; fi
    done
else echo "   (no mpirun / MPI build: the tp=2 / ep=2 rows skipped)"; fi

# ---- transformers 5's layout (--hf-layout 5): fused experts, the dense MLP by parameter ----
if "$MT" export --ckpt "$W/mixed.lora" --out "$W/mixed.ad5" --adapter --hf-layout 5 >"$W/r.out" 2>&1 &&
   grep -q "adapter layout: transformers 5" "$W/r.out" &&
   python3 - "$W/mixed.ad" "$W/mixed.ad5" <<'PY'
import json, struct, sys
from array import array
def st(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, e in h.items():
        if k == "__metadata__": continue
        lo, hi = e["data_offsets"]; a = array("f"); a.frombytes(b[8 + n + lo:8 + n + hi]); out[k] = (e["shape"], a)
    return out
v4, v5 = st(sys.argv[1] + "/adapter_model.safetensors"), st(sys.argv[2] + "/adapter_model.safetensors")
c = json.load(open(sys.argv[2] + "/adapter_config.json"))
assert c["target_modules"] == ["q_proj", "v_proj"], c["target_modules"]
assert c["target_parameters"] == ["mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                                  "mlp.experts.gate_up_proj", "mlp.experts.down_proj"], c["target_parameters"]
assert c["rank_pattern"] == {r".*\.gate_up_proj": 8} and c["alpha_pattern"] == {r".*\.gate_up_proj": 16}, c
P = "base_model.model.model.layers.1.mlp.experts"
E, r = 4, 4
def get(k, i, j): shp, a = v5[k]; return a[i * shp[1] + j]
n = 0
for e in range(E):
    for p, pj in enumerate(("gate_proj", "up_proj", "down_proj")):
        R = 2 * r if p < 2 else r; j0 = r if p == 1 else 0
        fa, fb = (P + ".base_layer.lora_A.weight", P + ".base_layer.lora_B.weight") if p < 2 else (P + ".lora_A.weight", P + ".lora_B.weight")
        (ra, ca), A = v4[f"{P}.{e}.{pj}.lora_A.weight"]; (rb, cb), B = v4[f"{P}.{e}.{pj}.lora_B.weight"]
        o0 = v4[f"{P}.0.gate_proj.lora_B.weight"][0][0] if p == 1 else 0
        assert all(A[j * ca + i] == get(fa, e * R + j0 + j, i) for j in range(r) for i in range(ca))
        assert all(B[o * r + j] == get(fb, o0 + o, (j0 + j) * E + e) for o in range(rb) for j in range(r)); n += 2
others = {k for k in v4 if ".experts." not in k}
assert all(v4[k] == v5[k] for k in others) and set(v5) - others == {P + x for x in (".base_layer.lora_A.weight", ".base_layer.lora_B.weight", ".lora_A.weight", ".lora_B.weight")}
print(f"   {n} per-expert tensors found bit for bit in the fused ones; {len(others)} others unchanged")
PY
then ok "mixed: --hf-layout 5 writes transformers 5's layout (fused experts = peft 0.21's conversion, the dense MLP by target_parameters)"
else bad "mixed --hf-layout 5"; cat "$W/r.out"; fi
if tr $DENSE --init-from "$W/mixed.hf" --lora-from "$W/mixed.ad5" --steps 0 --out "$W/mixed.imp5" &&
   "$MT" logits --ckpt "$W/mixed.imp5" --ids "$IDS" --out "$W/mixed.imp5.logits" >/dev/null 2>&1 &&
   cmp -s "$W/mixed.logits" "$W/mixed.imp5.logits" &&
   "$MT" export --ckpt "$W/mixed.imp5" --out "$W/mixed.ad5b" --adapter --hf-layout 5 >/dev/null 2>&1 &&
   cmp -s "$W/mixed.ad5/adapter_model.safetensors" "$W/mixed.ad5b/adapter_model.safetensors"; then
    ok "mixed: --lora-from the transformers-5 layout: logits bit-identical, re-export byte-identical"
else bad "mixed: --lora-from the transformers-5 layout"; cat "$W/log"; fi
MT_HF_PYTHON="$W/fake_py" bash -c "printf '#!/bin/sh\necho 5.24.0\n' > '$W/fake_py'; chmod +x '$W/fake_py'; '$MT' export --ckpt '$W/mixed.lora' --out '$W/x5b' --adapter" >"$W/r.out" 2>&1 &&
    grep -q "adapter layout: transformers 5 (the installed transformers 5)" "$W/r.out" &&
    ok "mixed: the installed transformers 5 picks layout 5 ($(head -1 "$W/r.out"))" || { bad "mixed: default layout with transformers 5"; cat "$W/r.out"; }
"$MT" export --ckpt "$W/mixed.lora" --out "$W/x4" --adapter --hf-layout 4 >"$W/r.out" 2>&1 && grep -q "adapter layout: transformers 4" "$W/r.out" &&
    ok "mixed: --hf-layout 4 written ($(head -1 "$W/r.out"))" || { bad "mixed --hf-layout 4"; cat "$W/r.out"; }
"$MT" export --ckpt "$W/moe.lora" --out "$W/m5" --adapter --hf-layout 5 >"$W/r.out" 2>&1 && grep -q "fused experts" "$W/r.out" &&
    tr $DENSE --init-from "$W/moe.hf" --lora-from "$W/m5" --steps 0 --out "$W/moe.imp5" &&
    "$MT" export --ckpt "$W/moe.imp5" --out "$W/m4" --adapter --hf-layout 4 >/dev/null 2>&1 &&
    cmp -s "$W/m4/adapter_model.safetensors" "$W/moe.ad/adapter_model.safetensors" &&
    ok "all-MoE: --hf-layout 5 -> --lora-from -> --hf-layout 4 gives the per-expert file back byte for byte" || { bad "all-MoE --hf-layout 5 round trip"; cat "$W/r.out" "$W/log"; }
# a fused gate_up B that mixes gate and up (trained as one rank-2r adapter on transformers 5)
cp -r "$W/mixed.ad5" "$W/mix5"
python3 - "$W/mix5/adapter_model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
e = h["base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight"]; lo = e["data_offsets"][0]; cols = e["shape"][1]
j = cols - 1   # row 0 (gate), the last rank slot (up's): off the diagonal block
struct.pack_into("<f", b, 8 + n + lo + 4 * j, 0.5); open(p, "wb").write(b)
PY
refuse "--lora-from: a fused gate_up_proj adapter that mixes gate and up" "$W/z98" "$MT" train $COMMON --init-from "$W/mixed.hf" --lora-from "$W/mix5" --out "$W/z98"
refuse "--hf-layout 3" "$W/x3" "$MT" export --ckpt "$W/dense.lora" --out "$W/x3" --adapter --hf-layout 3
refuse "--base-name without --adapter" "$W/x6" "$MT" export --ckpt "$W/dense.lora" --out "$W/x6" --base-name b --merge

refuse "--lora-from without --init-from" "$W/y1" "$MT" train $COMMON $DENSE --lora-from "$W/dense.ad" --out "$W/y1"
refuse "--lora-from with --resume" "$W/y2" "$MT" train $COMMON --resume "$W/dense.lora" --lora-from "$W/dense.ad" --out "$W/y2"
refuse "--lora-from with --lora" "$W/y3" "$MT" train $COMMON --init-from "$W/dense.hf" --lora-from "$W/dense.ad" --lora 2 --out "$W/y3"
refuse "--lora-from a folder that is not an adapter" "$W/y4" "$MT" train $COMMON --init-from "$W/dense.hf" --lora-from "$W/dense.hf" --out "$W/y4"
refuse "--lora-from onto another base shape (mixed adapter on the dense base)" "$W/y5" "$MT" train $COMMON --init-from "$W/dense.hf" --lora-from "$W/mixed.ad" --out "$W/y5"
tr $DENSE --set d_model=48 --steps 0 --out "$W/wide" || bad "wide base"
refuse "--lora-from onto a base of another width" "$W/y6" "$MT" train $COMMON --init-from "$W/wide" --lora-from "$W/dense.ad" --out "$W/y6"
# edited copies of the dense adapter: config keys and tensors
i=0
while IFS='|' read -r what edit; do
    i=$((i+1)); d="$W/bad$i"; cp -r "$W/dense.ad" "$d"
    python3 - "$d" "$edit" <<'PY' || { bad "cannot edit the adapter for: $what"; continue; }
import json, struct, sys
d, edit = sys.argv[1:]
kind, _, arg = edit.partition(":")
if kind == "cfg":
    c = json.load(open(f"{d}/adapter_config.json")); c.update(json.loads(arg)); json.dump(c, open(f"{d}/adapter_config.json", "w"))
else:
    p = f"{d}/adapter_model.safetensors"; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); data = b[8 + n:]
    if kind == "add":      # a tensor of another module, same shape as the first
        k0 = sorted(x for x in h if x != "__metadata__")[0]; lo, hi = h[k0]["data_offsets"]
        h[arg] = {"dtype": "F32", "shape": h[k0]["shape"], "data_offsets": [len(data), len(data) + hi - lo]}; data += data[lo:hi]
    elif kind == "drop":   # drop every tensor whose name contains arg
        h = {k: v for k, v in h.items() if arg not in k}
    t = json.dumps(h).encode(); t += b" " * (-len(t) % 8)
    open(p, "wb").write(struct.pack("<Q", len(t)) + t + data)
PY
    refuse "--lora-from: $what" "$W/z$i" "$MT" train $COMMON --init-from "$W/dense.hf" --lora-from "$d" --out "$W/z$i"
done <<'EOF'
lora_dropout 0.05|cfg:{"lora_dropout": 0.05}
bias all|cfg:{"bias": "all"}
use_dora|cfg:{"use_dora": true}
use_rslora|cfg:{"use_rslora": true}
rank_pattern|cfg:{"rank_pattern": {"q_proj": 8}}
layers_to_transform|cfg:{"layers_to_transform": [0]}
modules_to_save|cfg:{"modules_to_save": ["lm_head"]}
target module lm_head|cfg:{"target_modules": ["q_proj", "lm_head"]}
peft_type IA3|cfg:{"peft_type": "IA3"}
a tensor of lm_head|add:base_model.model.lm_head.lora_A.weight
a DoRA magnitude tensor|add:base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector
a layer missing (layer 1's q_proj)|drop:layers.1.self_attn.q_proj
EOF
cp -r "$W/moe.ad" "$W/gonly"
python3 - "$W/gonly/adapter_model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
h = {k: v for k, v in h.items() if not (".experts." in k and ("up_proj" in k or "down_proj" in k))}
t = json.dumps(h).encode(); t += b" " * (-len(t) % 8); open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
refuse "--lora-from: the experts' gate_proj only" "$W/z99" "$MT" train $COMMON --init-from "$W/moe.hf" --lora-from "$W/gonly" --out "$W/z99"

if [ -z "$PY" ] && [ $fails -eq 0 ]; then echo "$passes passed; SKIPPED (numpy parts: no numpy)"; exit 77; fi
finish
