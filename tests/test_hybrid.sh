#!/usr/bin/env bash
# test_hybrid.sh BUILD_DIR — hybrid models (pattern letter M, Mamba-3 blocks,
# issue 15) end to end on one rank:
#   1. bad mamba_* keys: one line on stderr, exit 2, nothing written;
#   2. an AMEM model trains (loss falls) and its receipt's FLOPs per token are
#      the table's: 6 x matmul params + attention scores + the M scan;
#   3. greedy `sample` (recurrent state per M layer, O(1) per token) picks, at
#      every generated position, the argmax of the full forward's logits over
#      the same ids (`meshtrain logits`);
#   4. `export` writes the weights under their documented names with a
#      config.json saying MeshtrainHybrid; `import` refuses that config (exit 2).
set -u
BUILD=${1:?usage: test_hybrid.sh BUILD_DIR}
. "$(dirname "$0")/cli_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern
HY="--set vocab_size=64 --set n_layer=4 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=8 --set lr=0.01 --set pattern=AMEM --set n_experts=4 --set top_k=2 --set expert_hidden=32 --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8"
COMMON="--peak-flops 1e11 --quiet --data $W/train.bin"

# ---- 1: bad input ----
while IFS='|' read -r set expect; do
    rm -rf "$W/bad"
    "$MT" train $HY $COMMON --set $set --steps 2 --out "$W/bad" >/dev/null 2>"$W/bad.err"
    rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$W/bad.err")" = 1 ] && grep -q -- "$expect" "$W/bad.err" && [ ! -e "$W/bad" ]; then
        ok "bad input $set: exit 2, one line ($(cat "$W/bad.err"))"
    else bad "bad input $set: rc=$rc"; cat "$W/bad.err"; fi
done <<'LIST'
mamba_d_state=7|mamba_d_state must be even
mamba_headdim=24|mamba_headdim must divide d_inner
mamba_ngroups=3|mamba_ngroups must divide nheads
mamba_expand=0|'mamba_expand': 0 is out of range
mamba_chunk=0|'mamba_chunk': 0 is out of range
LIST

# ---- 2: training and its FLOPs ----
if "$MT" train $HY $COMMON --steps 30 --out "$W/run" >"$W/run.log" 2>&1 && python3 - "$W/run/receipt.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); L = r["losses"]
assert L[-1] < 0.7 * L[0], (L[0], L[-1])
# AMEM: D 32, V 64, T 16, H 4 (hd 8), K 2, F 128; E 4 top 2 Fe 32; M: E_in 64 = 4 heads x 16, G 2, N 8
D, V, T, H, hd, K, F = 32, 64, 16, 4, 8, 2, 128
attn = D * (2 * H * hd + 2 * K * hd); mlp = 3 * D * F
moe = 4 * D + 2 * 3 * D * 32
Ei, Hm, P, G, N = 64, 4, 16, 2, 8
Win = 2 * Ei + 2 * G * N + Hm + Hm * N // 2 + Hm
mamba = D * (Win + Ei)
mm = (attn + mlp) + 2 * (mamba + mlp) + (attn + moe) + V * D
want = 6 * mm + 2 * 12 * T * H * hd + 2 * 24 * Hm * P * N
got = r["timing"]["flops_per_token"]
print("   loss %.3f -> %.3f, flops/token %d (want %d), scan %.2g s/step" %
      (L[0], L[-1], got, want, r["timing"]["op_profile_s_per_step"]["scan"]))
assert got == want and "per M layer" in r["timing"]["flops_convention"]
assert r["timing"]["op_profile_s_per_step"]["scan"] > 0
PY
then ok "AMEM trains; receipt FLOPs per token = the table's (M scan included), scan in the op profile"
else bad "AMEM training / FLOPs"; tail -5 "$W/run.log"; fi

# ---- 2b: resume: mamba_chunk is a speed knob (may change), mamba_d_state is the model (refused) ----
if "$MT" train $HY $COMMON --set mamba_chunk=3 --steps 32 --resume "$W/run" --out "$W/res" >"$W/res.log" 2>&1 && \
   python3 -c "import json,sys; r=json.load(open('$W/res/receipt.json')); sys.exit(not (len(r['losses']) == 2 and r['losses'][-1] < 1.0))"; then
    ok "resume with another mamba_chunk continues (2 steps)"
else bad "resume with another mamba_chunk"; tail -3 "$W/res.log"; fi
"$MT" train $HY $COMMON --set mamba_d_state=4 --steps 32 --resume "$W/run" --out "$W/res2" >/dev/null 2>"$W/res2.err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$W/res2.err")" = 1 ] && [ ! -e "$W/res2" ]; then
    ok "resume with another mamba_d_state refused ($(cat "$W/res2.err"))"
else bad "resume with another mamba_d_state: rc=$rc"; cat "$W/res2.err"; fi

# ---- 3: greedy decoding == argmax of the full forward ----
PROMPT="5,9,2,40"
if "$MT" sample --ckpt "$W/run" --prompt-ids "$PROMPT" --tokens 11 --temperature 0 >"$W/sample.txt" 2>"$W/sample.err"; then
    ids=$(tr ' ' ',' <"$W/sample.txt")
    if "$MT" logits --ckpt "$W/run" --ids "$ids" --out "$W/lg.safetensors" >/dev/null 2>"$W/lg.err" && \
       python3 - "$W/lg.safetensors" "$ids" 4 <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
t = h["logits"]; rows, V = t["shape"]; a, b = t["data_offsets"]
vals = struct.unpack("<%df" % (rows * V), raw[8 + n + a:8 + n + b])
ids = [int(x) for x in sys.argv[2].split(",")]; p = int(sys.argv[3])
assert rows == len(ids) and len(ids) == p + 11, (rows, len(ids))
for i in range(p - 1, len(ids) - 1):
    row = vals[i * V:(i + 1) * V]
    top = max(range(V), key=lambda v: (row[v], -v))
    srt = sorted(row)
    assert top == ids[i + 1] or srt[-1] - srt[-2] < 1e-5, (i, top, ids[i + 1])
print("   generated %s: each is the argmax of the full forward" % ids[p:])
PY
    then ok "greedy sample on AMEM == argmax of the full forward at every generated position"
    else bad "greedy sample vs logits"; cat "$W/lg.err"; fi
else bad "sample on a hybrid checkpoint"; cat "$W/sample.err"; fi

# ---- 4: export / import ----
if "$MT" export --ckpt "$W/run" --out "$W/hf" >/dev/null 2>"$W/exp.err" && grep -q "MeshtrainHybrid" "$W/exp.err" && \
   python3 - "$W/hf" <<'PY'
import json, struct, sys
d = sys.argv[1]; c = json.load(open(d + "/config.json"))
assert c["architectures"] == ["MeshtrainHybrid"] and c["model_type"] == "meshtrain_hybrid", c["architectures"]
assert c["meshtrain_pattern"] == "AMEM" and c["meshtrain_mamba_d_state"] == 8 and c["meshtrain_mamba_ngroups"] == 2
raw = open(d + "/model.safetensors", "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
want = {"in_proj_z.weight": [64, 32], "in_proj_x.weight": [64, 32], "in_proj_B.weight": [16, 32],
        "in_proj_C.weight": [16, 32], "in_proj_dt.weight": [4, 32], "in_proj_theta.weight": [16, 32],
        "in_proj_lam.weight": [4, 32], "out_proj.weight": [32, 64], "dt_bias": [4], "A_log": [4], "D": [4],
        "B_norm.weight": [8], "C_norm.weight": [8], "B_bias": [4, 8], "C_bias": [4, 8], "norm.weight": [64]}
for l in (1, 3):
    for k, s in want.items():
        t = h["model.layers.%d.mixer.%s" % (l, k)]
        assert t["shape"] == s and t["dtype"] == "F32", (l, k, t)
    assert "model.layers.%d.self_attn.q_proj.weight" % l not in h
assert "model.layers.0.self_attn.q_proj.weight" in h and "model.layers.2.mlp.experts.3.down_proj.weight" in h
print("   %d tensors, M layers under model.layers.{l}.mixer.*" % (len(h) - ("__metadata__" in h)))
PY
then ok "export writes the hybrid's weights under documented names, config.json says MeshtrainHybrid"
else bad "hybrid export"; cat "$W/exp.err"; fi
"$MT" import --hf "$W/hf" --out "$W/imp" >/dev/null 2>"$W/imp.err"; rc=$?
if [ $rc -eq 2 ] && grep -q "meshtrain_hybrid is not supported" "$W/imp.err" && [ ! -e "$W/imp" ]; then
    ok "import of a MeshtrainHybrid export is refused (exit 2, nothing written)"
else bad "import of a hybrid export: rc=$rc"; cat "$W/imp.err"; fi

finish
