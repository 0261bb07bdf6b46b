#!/usr/bin/env bash
# test_hf_roundtrip.sh BUILD_DIR — meshtrain's forward against a reference it
# does not share code with: tests/hf/ref_forward.py (numpy, float64) runs the
# model from an exported folder alone (config.json + model.safetensors) and
# must equal `meshtrain logits` (logits after softcap, lm/aux/z terms) for a
# dense model, a MoE with a shared expert and softcap (exported with
# --allow-lossy: HF cannot run it, the reference can), a plain MoE and a
# hybrid with Mamba-3 blocks (MeshtrainHybrid, from its export alone), MTP
# models (the mtp_k losses; modules of kind A and M), Mixture-of-Depths models
# (routed a / e layers, dense, MoE and hybrid; the mod_aux loss). Then
# the aux and z terms against values computed by hand for a fixed routing
# (zero router: uniform probabilities, experts 0..k-1). No transformers needed;
# numpy is (skipped, exit 77, without it).
set -u
BUILD=${1:?build dir}
PY=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "SKIPPED (no numpy)"; exit 77; }
. "$(dirname "$0")/cli_lib.sh"

python3 "$HERE/make_shard.py" "$W/train.bin" 20000 64 pattern >/dev/null
TINY="--set vocab_size=64 --set n_layer=2 --set d_model=32 --set n_head=4 --set n_kv_head=2 --set seq_len=16 --set batch_size=4 --set warmup_steps=2 --set rope_theta=500"
MOE="--set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=16 --set aux_loss_coef=0.02 --set z_loss_coef=0.003"
IDS="3,17,42,5,63,0,8,8,21,34,55,1,2,9,30,12,7,44,61,18"

roundtrip() {  # name, export flags, then train flags
    local name=$1 eflags=$2; shift 2
    if ! $MT train $TINY "$@" --data "$W/train.bin" --out "$W/$name" --steps 12 --set lr=0.03 --quiet --peak-flops 1e11 >/dev/null 2>"$W/err"; then
        bad "$name: train ($(cat "$W/err"))"; return; fi
    if ! $MT export --ckpt "$W/$name" --out "$W/$name.hf" $eflags >/dev/null 2>"$W/err"; then
        bad "$name: export ($(cat "$W/err"))"; return; fi
    if ! $MT logits --ckpt "$W/$name" --ids "$IDS" --out "$W/$name.logits" >/dev/null 2>"$W/err"; then
        bad "$name: logits ($(cat "$W/err"))"; return; fi
    if $PY "$HERE/hf/ref_forward.py" compare "$W/$name.hf" "$W/$name.logits" "$IDS" --atol 1e-5; then
        ok "$name: numpy reference from the export == meshtrain logits and loss terms"
    else bad "$name: numpy reference vs meshtrain"; fi
}

roundtrip dense ""
roundtrip moe "" $MOE
roundtrip moe_shared_softcap "--allow-lossy" $MOE --set shared_expert_hidden=16 --set logit_softcap=2
# null experts (SPEC 1e): the router's E + Z rows, null slots add nothing (exported with --allow-lossy:
# transformers cannot run them; the reference reads meshtrain_n_null_experts)
roundtrip moe_null "--allow-lossy" $MOE --set n_null_experts=3 --set top_k=3
# a hybrid (M = Mamba-3 blocks, issue 15): exported as MeshtrainHybrid, the reference runs its mixer
# through tests/mamba3_ref.py; 2 groups, chunk 8 (does not divide the 20 ids)
roundtrip hybrid "" --set n_layer=4 --set pattern=MEAM --set n_experts=4 --set top_k=2 --set expert_hidden=16 \
    --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_ngroups=2 --set mamba_chunk=8 --set logit_softcap=2

# MTP (SPEC 1e): 2 modules of kind A (dense) and one of kind M (hybrid), exported with --allow-lossy
# (transformers has no MTP); the reference computes each mtp_k loss from the export alone
roundtrip mtp "--allow-lossy" --set mtp_depth=2 --set mtp_loss_coef=0.4
roundtrip mtp_hybrid "--allow-lossy" --set n_layer=2 --set pattern=MA --set mamba_d_state=8 --set mamba_headdim=16 \
    --set mamba_chunk=8 --set mtp_depth=1 --set mtp_block=M
$MT export --ckpt "$W/mtp" --out "$W/refused_mtp" >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -q "MTP modules (mtp_depth 2" "$W/err" && [ ! -e "$W/refused_mtp" ] &&
    ok "MTP: export refused without --allow-lossy: $(cat "$W/err")" || bad "MTP export not refused (rc $rc: $(cat "$W/err"))"
if [ -d "$W/mtp.hf" ] && python3 -c "import json,sys; c=json.load(open(sys.argv[1])); \
assert c['meshtrain_mtp_depth']==2 and c['meshtrain_mtp_block']=='A' and abs(c['meshtrain_mtp_loss_coef']-0.4)<1e-6 \
and 'meshtrain_mtp_note' in c, c" "$W/mtp.hf/config.json" &&
   $MT import --hf "$W/mtp.hf" --out "$W/mtp.imp" >/dev/null 2>"$W/err" &&
   $MT logits --ckpt "$W/mtp.imp" --ids "$IDS" --out "$W/mtp.imp.logits" >/dev/null 2>>"$W/err" &&
   cmp -s "$W/mtp.logits" "$W/mtp.imp.logits"; then
    ok "MTP: config.json keeps meshtrain_mtp_*; import reads them back (logits and mtp losses bit-identical)"
else bad "MTP: export keys / import round trip ($(cat "$W/err"))"; fi

# Mixture-of-Depths (SPEC 1e): routed a / e layers, exported with --allow-lossy (transformers would
# run every token through every block); the reference selects, runs the block at the selected
# positions and combines from the export alone (C = ceil(0.3 x 20) = 6 of the 20 ids; 0.5: 10)
roundtrip mod "--allow-lossy" --set pattern=aA --set mod_capacity=0.3 --set mod_aux_coef=0.05
roundtrip mod_moe "--allow-lossy" $MOE --set pattern=ae --set mod_capacity=0.5 --set mod_aux_coef=0.05
roundtrip mod_hybrid "" --set n_layer=3 --set pattern=aMe --set n_experts=4 --set top_k=2 --set expert_hidden=16 \
    --set mamba_d_state=8 --set mamba_headdim=16 --set mamba_chunk=8 --set mod_capacity=0.3
$MT export --ckpt "$W/mod" --out "$W/refused_mod" >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -q "Mixture-of-Depths routed layers (1, pattern aA" "$W/err" &&
    [ ! -e "$W/refused_mod" ] && ok "MoD: export refused without --allow-lossy: $(cat "$W/err")" ||
    bad "MoD export not refused (rc $rc: $(cat "$W/err"))"
for name in mod mod_moe mod_hybrid; do
    if [ -d "$W/$name.hf" ] && python3 -c "import json,sys; c=json.load(open(sys.argv[1])); \
assert c['meshtrain_mod_layers'] in ([0], [0, 1], [0, 2]) and 'meshtrain_mod_note' in c and c['meshtrain_mod_capacity'] in (0.3, 0.5)" \
        "$W/$name.hf/config.json"; then
        ok "$name: config.json keeps meshtrain_mod_layers / _capacity / _aux_coef / _note"
    else bad "$name: meshtrain_mod_* keys"; fi
done
if $MT import --hf "$W/mod_moe.hf" --out "$W/mod.imp" >/dev/null 2>"$W/err" &&
   $MT logits --ckpt "$W/mod.imp" --ids "$IDS" --out "$W/mod.imp.logits" >/dev/null 2>>"$W/err" &&
   cmp -s "$W/mod_moe.logits" "$W/mod.imp.logits"; then
    ok "MoD: import reads the routed layers back (pattern ae; logits and mod_aux bit-identical)"
else bad "MoD: import round trip ($(cat "$W/err"))"; fi

# sampling a routed model (SPEC 1e: a token runs a routed block iff r > 0; the layer's KV cache holds
# only those tokens, at their original positions): greedy ids == argmax of the reference's sampling-rule
# forward, for the dense, MoE and hybrid routed models
for name in mod mod_moe mod_hybrid; do
    if $MT sample --ckpt "$W/$name" --prompt-ids "5,9,2,40" --tokens 11 --temperature 0 >"$W/$name.sample" 2>"$W/err" &&
       $PY "$HERE/hf/ref_forward.py" greedy "$W/$name.hf" "$(tr ' ' ',' <"$W/$name.sample")" 4; then
        ok "$name: greedy sample == argmax of the reference with the r > 0 rule"
    else bad "$name: sample of a routed model ($(cat "$W/err"))"; fi
done

# the lossy model is refused without --allow-lossy, naming both features, writing nothing
$MT export --ckpt "$W/moe_shared_softcap" --out "$W/refused" >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -q softcap "$W/err" && grep -q "shared expert" "$W/err" && [ ! -e "$W/refused" ] &&
    ok "lossy export refused: $(cat "$W/err")" || bad "lossy export not refused (rc $rc: $(cat "$W/err"))"

# null experts: refused without --allow-lossy (one line naming them, nothing written); the lossy
# export keeps them under meshtrain_* keys and says so; import reads them back (same logits)
$MT export --ckpt "$W/moe_null" --out "$W/refused_null" >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$W/err")" = 1 ] && grep -q "null experts (n_null_experts 3" "$W/err" && [ ! -e "$W/refused_null" ] &&
    ok "null experts: export refused without --allow-lossy: $(cat "$W/err")" || bad "null experts export not refused (rc $rc: $(cat "$W/err"))"
if [ -d "$W/moe_null.hf" ] && python3 - "$W/moe_null.hf/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["meshtrain_n_null_experts"] == 3 and c["num_experts"] == 4 and "meshtrain_null_experts_note" in c, c
PY
then
    if $MT import --hf "$W/moe_null.hf" --out "$W/moe_null.imp" >/dev/null 2>"$W/err" &&
       $MT logits --ckpt "$W/moe_null.imp" --ids "$IDS" --out "$W/moe_null.imp.logits" >/dev/null 2>>"$W/err" &&
       cmp -s "$W/moe_null.logits" "$W/moe_null.imp.logits"; then
        ok "null experts: config.json keeps meshtrain_n_null_experts; import reads it back (logits bit-identical)"
    else bad "null experts: import round trip ($(cat "$W/err"))"; fi
else bad "null experts: config.json keys"; fi

# hand-computed aux and z: zero the routers of the plain MoE export, import, forward
if [ -d "$W/moe.hf" ]; then
    $PY - "$W/moe.hf" "$W/uniform.hf" <<'PY' || bad "cannot build the zero-router folder"
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
shutil.copy(f"{src}/config.json", dst)
b = bytearray(open(f"{src}/model.safetensors", "rb").read())
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
for k, e in h.items():
    if k.endswith("mlp.gate.weight"):
        lo, hi = e["data_offsets"]; b[8 + n + lo:8 + n + hi] = bytes(hi - lo)
open(f"{dst}/model.safetensors", "wb").write(bytes(b))
PY
    if $MT import --hf "$W/uniform.hf" --out "$W/uniform_ck" >/dev/null 2>"$W/err" &&
       $MT logits --ckpt "$W/uniform_ck" --ids "$IDS" --out "$W/uniform.logits" >/dev/null 2>>"$W/err" &&
       $PY "$HERE/hf/ref_forward.py" uniform "$W/uniform.hf" "$W/uniform.logits"; then
        ok "aux and z equal the hand-computed values for a fixed (uniform) routing"
    else bad "aux/z by hand ($(cat "$W/err"))"; fi
fi

# tokenizer.json: run in plain Python the way `tokenizers` does (ASCII texts,
# where the regex classes are exact) == `meshtrain tokenizer encode`
mkdir -p "$W/corpus"
python3 - "$W/corpus/t.txt" <<'PY'
import random, string, sys
r = random.Random(7)
w = "the a loss model it's we'll DON'T rank 2024 x_y f(x) {}".split()
w += ["".join(r.choice(string.ascii_letters) for _ in range(r.randrange(2, 8))) for _ in range(300)]
open(sys.argv[1], "w").write("".join(" ".join(r.choice(w) for _ in range(9)) + (" \n\n" if i % 5 == 0 else "\n")
                                     for i in range(3000)))
PY
python3 - "$W/texts.json" <<'PY'
import json, sys
json.dump(["Hello world", "The model's loss: 3.1415926 after 12345 steps!", "int f(int x) { return x * 2; }\n\n",
           "  leading and trailing   ", "line one\nline two\r\n\r\nthree", "tabs\there\t\tand  there",
           "it's they're we'll I'M DON'T", "x" * 300, "12 345 6789 0", "a\n\n\n  b", "MiXeD CaSe 99problems"],
          open(sys.argv[1], "w"))
PY
if $MT tokenizer train --input "$W/corpus" --vocab 400 --out "$W/tok.bin" >/dev/null 2>"$W/err" &&
   python3 "$HERE/make_shard.py" "$W/t400.bin" 4000 400 >/dev/null &&
   $MT train $TINY --set vocab_size=400 --data "$W/t400.bin" --out "$W/tokmodel" --steps 0 --quiet --peak-flops 1e11 >/dev/null 2>>"$W/err" &&
   $MT export --ckpt "$W/tokmodel" --out "$W/tokmodel.hf" --tokenizer "$W/tok.bin" >/dev/null 2>>"$W/err" &&
   python3 - "$W/texts.json" "$W/mt_ids.json" "$MT" "$W/tok.bin" <<'PY'
import json, subprocess, sys
texts = json.load(open(sys.argv[1]))
ids = [[int(x) for x in subprocess.run([sys.argv[3], "tokenizer", "encode", "--tokenizer", sys.argv[4]], input=t.encode(),
        capture_output=True, check=True).stdout.split()] for t in texts]
json.dump(ids, open(sys.argv[2], "w"))
PY
then
    python3 "$HERE/hf/bpe_ref.py" "$W/tokmodel.hf/tokenizer.json" "$W/texts.json" "$W/mt_ids.json" &&
    python3 -c "
import json,sys
c=json.load(open('$W/tokmodel.hf/tokenizer_config.json')); g=json.load(open('$W/tokmodel.hf/generation_config.json'))
m=json.load(open('$W/tokmodel.hf/config.json')); t=json.load(open('$W/tokmodel.hf/tokenizer.json'))
assert c['bos_token']==c['eos_token']=='<|bos|>' and g['bos_token_id']==g['eos_token_id']==m['bos_token_id']==m['eos_token_id']==399
assert t['added_tokens'][0]['id']==399 and t['added_tokens'][0]['special']
" && ok "tokenizer.json reproduces meshtrain's ids; bos/eos in config, generation_config, tokenizer_config" ||
    bad "tokenizer.json"
else bad "tokenizer export ($(cat "$W/err"))"; fi
# a tokenizer with more tokens than the model: refused, nothing written
$MT export --ckpt "$W/dense" --out "$W/toobig" --tokenizer "$W/tok.bin" >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && [ ! -e "$W/toobig" ] && ok "tokenizer larger than the model refused ($(cat "$W/err"))" ||
    bad "tokenizer larger than the model (rc $rc)"

finish
