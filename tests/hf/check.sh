#!/usr/bin/env bash
# tests/hf/check.sh BUILD_DIR [PYTHON] — opt-in check against transformers itself
# (issue 17 item 6). PYTHON (default $MT_HF_PYTHON, else python3) must have
# torch and transformers; without them: "SKIPPED (no transformers)", exit 77.
#   1. meshtrain -> HF: a dense and a MoE model trained on text with meshtrain's
#      own tokenizer, exported; AutoModelForCausalLM logits == `meshtrain
#      logits`, greedy generation == `meshtrain sample --temperature 0`;
#      AutoTokenizer ids == `meshtrain tokenizer encode` on the texts that are
#      supposed to match (docs/export.md), and decode gives the text back.
#   2. HF -> meshtrain: a random Qwen3 (tied embeddings, no head_dim key) and a
#      random Qwen3-MoE saved by transformers -> import: logits equal, and
#      `train --init-from` step-0 loss equal to HF's on the same batch.
#   3. PEFT (when PYTHON has peft; issue 34, docs/lora.md): dense, all-MoE and
#      mixed (pattern=AE) LoRA runs -> export --adapter ->
#      AutoPeftModelForCausalLM: no missing keys, logits == `meshtrain logits`;
#      a PEFT-made adapter -> `train --lora-from` (logits == PEFT's) -> export
#      --adapter: tensors bit-identical to PEFT's.
# Not registered with ctest (it needs a python with torch); run it by hand:
#   python3 -m venv /tmp/hf4 && /tmp/hf4/bin/pip install 'transformers>=4.57,<5' 'peft>=0.17,<0.18' torch
#   (and transformers 5: 'transformers>=5' 'peft>=0.21')
#   bash tests/hf/check.sh build /tmp/hf4/bin/python
set -u
B=${1:?build dir}
PY=${2:-${MT_HF_PYTHON:-python3}}
MT="$B/meshtrain"
HERE=$(cd "$(dirname "$0")" && pwd)
if ! "$PY" -c "import torch, transformers" 2>/dev/null; then echo "SKIPPED (no transformers in $PY)"; exit 77; fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
fails=0; passes=0
ok()  { passes=$((passes+1)); echo "PASS $1"; }
bad() { fails=$((fails+1)); echo "FAIL $1"; }
echo "transformers $("$PY" -c 'import transformers; print(transformers.__version__)'), torch $("$PY" -c 'import torch; print(torch.__version__)')"

# ---- a corpus, meshtrain's tokenizer, shards ----
mkdir -p "$W/corpus"
python3 - "$W/corpus" <<'PY'
import random, sys
r = random.Random(3)
words = "the a model train token shard mesh rank expert router gate loss step we they it's don't I'll you're".split()
with open(f"{sys.argv[1]}/text.txt", "w") as f:
    for i in range(3000):
        s = " ".join(r.choice(words) for _ in range(r.randrange(3, 12)))
        f.write(f"{s.capitalize()}, {r.randrange(100000)} times.\n")
        if i % 7 == 0: f.write(f"int f{i}(int x) {{ return x * {i} + 1; }}\n\n")
        if i % 11 == 0: f.write("café naïve — 中文 😀 x\t\ty\n")
PY
$MT tokenizer train --input "$W/corpus" --vocab 512 --out "$W/tok.bin" >/dev/null 2>&1 &&
$MT prepare --input "$W/corpus" --tokenizer "$W/tok.bin" --out "$W/data" --val-frac 0.1 >/dev/null 2>&1 ||
    { echo "FAIL cannot build the tokenizer / data"; exit 1; }

T=32
BASE="--set n_layer=2 --set d_model=64 --set n_head=4 --set n_kv_head=2 --set seq_len=$T --set batch_size=8 --set lr=0.01 --set warmup_steps=5"
IDS=$(python3 -c "
import struct; b=open('$(ls "$W"/data/*train*.bin | head -1)','rb').read(); print(','.join(str(x) for x in struct.unpack('<24H', b[1024:1072])))")

# MT_HF_STAGES (default 123): the stages to run
STAGES=${MT_HF_STAGES:-123}
# ---- 1. meshtrain -> HF ----
for kind in dense moe; do
    case $STAGES in *1*) ;; *) continue ;; esac
    extra=""; [ $kind = moe ] && extra="--set pattern=AE --set n_experts=4 --set top_k=2 --set expert_hidden=32"
    if ! $MT train $BASE $extra --data "$W/data" --out "$W/$kind" --steps 30 --quiet --peak-flops 1e11 >/dev/null 2>"$W/err" ||
       ! $MT export --ckpt "$W/$kind" --out "$W/$kind.hf" >/dev/null 2>>"$W/err" ||
       ! $MT logits --ckpt "$W/$kind" --ids "$IDS" --out "$W/$kind.logits" >/dev/null 2>>"$W/err"; then
        bad "$kind: train/export/logits ($(cat "$W/err"))"; continue; fi
    PROMPT=$(echo "$IDS" | cut -d, -f1-8)
    G=$($MT sample --ckpt "$W/$kind" --prompt-ids "$PROMPT" --tokens 16 --temperature 0 2>"$W/err") || { bad "$kind: sample"; continue; }
    "$PY" "$HERE/check_hf.py" export "$W/$kind.hf" "$W/$kind.logits" "$IDS" "$G" &&
        ok "$kind: export == transformers (logits, greedy text)" || bad "$kind: export vs transformers"
done

case $STAGES in *1*)
# tokenizer: the texts the two pre-tokenizers split alike (docs/export.md)
python3 - "$W/texts.json" <<'PY'
import json, sys
texts = ["Hello world", "The model's loss: 3.1415926 after 12345 steps!", "int f(int x) { return x * 2; }\n\n",
         "  leading spaces and trailing   ", "line one\nline two\r\n\r\nthree", "tabs\there\t\tand  there",
         "it's they're we'll I'M DON'T", "café naïve — 中文 😀", "x" * 300, "12 345 6789 0", "a\n\n\n  b",
         "emoji 😀😀 and ñ ü", "MiXeD CaSe 99problems"]
json.dump(texts, open(sys.argv[1], "w"))
PY
python3 - "$W/texts.json" "$W/mt_ids.json" "$MT" "$W/dense/ckpt" <<'PY'
import glob, json, subprocess, sys
texts = json.load(open(sys.argv[1])); mt = sys.argv[3]
tok = sorted(glob.glob(f"{sys.argv[4]}/*/tokenizer.bin"))[-1]
ids = [[int(x) for x in subprocess.run([mt, "tokenizer", "encode", "--tokenizer", tok], input=t.encode(),
        capture_output=True, check=True).stdout.split()] for t in texts]
json.dump(ids, open(sys.argv[2], "w"))
PY
"$PY" "$HERE/check_hf.py" tokenizer "$W/dense.hf" "$W/texts.json" "$W/mt_ids.json" &&
    ok "tokenizer.json: AutoTokenizer == meshtrain tokenizer encode" || bad "tokenizer.json vs meshtrain"
;; esac

# ---- 2. HF -> meshtrain ----
for kind in dense moe; do
    case $STAGES in *2*) ;; *) continue ;; esac
    "$PY" "$HERE/check_hf.py" make $kind "$W/hf_$kind" 512 || { bad "$kind: transformers could not save a model"; continue; }
    if $MT import --hf "$W/hf_$kind" --out "$W/imp_$kind" >/dev/null 2>"$W/err" &&
       $MT logits --ckpt "$W/imp_$kind" --ids "$IDS" --out "$W/imp_$kind.logits" >/dev/null 2>>"$W/err"; then
        "$PY" "$HERE/check_hf.py" hf_logits "$W/hf_$kind" "$W/imp_$kind.logits" "$IDS" &&
            ok "$kind: transformers model -> import: logits equal" || bad "$kind: import logits"
    else bad "$kind: import ($(cat "$W/err"))"; fi
    if $MT train --init-from "$W/hf_$kind" --set seq_len=$T --set batch_size=4 --data "$W/data" --out "$W/ft_$kind" \
          --steps 1 --quiet --peak-flops 1e11 >/dev/null 2>"$W/err"; then
        "$PY" "$HERE/check_hf.py" hf_loss "$W/hf_$kind" "$W/data" $T 4 "$W/ft_$kind/receipt.json" &&
            ok "$kind: train --init-from the transformers folder: step-0 loss == HF's" || bad "$kind: step-0 loss"
    else bad "$kind: train --init-from ($(cat "$W/err"))"; fi
done

# ---- 3. PEFT (issue 34): meshtrain LoRA -> PEFT, and PEFT -> meshtrain -> PEFT ----
# Rows: KIND PATTERN meshtrain-targets PEFT-targets. The adapters' base is the
# exported Hugging Face folder, so adapter_config.json names it and
# AutoPeftModelForCausalLM finds it. export --adapter picks its layout from
# the venv's transformers (MT_HF_PYTHON); the round trip exports with
# --hf-layout $TMAJ (transformers 5 saves its fused experts).
if ! "$PY" -c "import peft" 2>/dev/null; then echo "SKIPPED the PEFT stage (no peft in $PY)"
elif case $STAGES in *3*) false ;; *) true ;; esac; then :
else
TMAJ=$("$PY" -c 'import transformers; print(transformers.__version__.split(".")[0])')
echo "peft $("$PY" -c 'import peft; print(peft.__version__)')"
while read -r kind pat tg ptg; do
    extra="--set pattern=$pat"; [ $pat != AA ] && extra="$extra --set n_experts=4 --set top_k=2 --set expert_hidden=32"
    if ! $MT train $BASE $extra --data "$W/data" --out "$W/p_$kind" --steps 10 --quiet --peak-flops 1e11 >/dev/null 2>"$W/err" ||
       ! $MT export --ckpt "$W/p_$kind" --out "$W/p_$kind.hf" >/dev/null 2>>"$W/err" ||
       ! $MT train $BASE --init-from "$W/p_$kind.hf" --lora 4:8:$tg --set lr=0.02 --data "$W/data" --out "$W/l_$kind" \
             --steps 20 --quiet --peak-flops 1e11 >/dev/null 2>>"$W/err" ||
       ! $MT logits --ckpt "$W/l_$kind" --ids "$IDS" --out "$W/l_$kind.logits" >/dev/null 2>>"$W/err"; then
        bad "peft $kind: base / LoRA run ($(cat "$W/err"))"; continue; fi
    MT_HF_PYTHON="$PY" $MT export --ckpt "$W/l_$kind" --out "$W/l_$kind.ad" --adapter >"$W/out" 2>"$W/err"; rc=$?
    if [ $rc != 0 ]; then bad "peft $kind: export --adapter ($(cat "$W/err"))"
    else
        echo "  $(head -1 "$W/out")"
        "$PY" "$HERE/check_peft.py" load "$W/l_$kind.ad" "$W/l_$kind.logits" "$IDS" &&
            ok "peft $kind: meshtrain adapter -> AutoPeftModelForCausalLM: no missing keys, logits == meshtrain" ||
            bad "peft $kind: meshtrain adapter in PEFT"
    fi
    if [ $kind = mixed ] && [ "$TMAJ" -ge 5 ]; then
        # the bug of issue 34, kept visible: the transformers-4 file on transformers 5 (this check must fail)
        $MT export --ckpt "$W/l_$kind" --out "$W/l_$kind.ad4" --adapter --hf-layout 4 >/dev/null 2>&1
        ! "$PY" "$HERE/check_peft.py" load "$W/l_$kind.ad4" "$W/l_$kind.logits" "$IDS" &&
            ok "peft $kind: the transformers-4 file on transformers $TMAJ loads wrongly (peft drops the dense MLP adapters): why layout 5" ||
            bad "peft $kind: the transformers-4 file on transformers $TMAJ was expected to load wrongly"
    fi
    # PEFT -> meshtrain -> PEFT
    mkdir -p "$W/pm_$kind" && echo "$IDS" > "$W/pm_$kind/ids.txt"
    "$PY" "$HERE/check_peft.py" make "$W/p_$kind.hf" "$ptg" "$W/pm_$kind" || { bad "peft $kind: PEFT could not make an adapter"; continue; }
    if $MT train $BASE --init-from "$W/p_$kind.hf" --lora-from "$W/pm_$kind" --data "$W/data" --out "$W/i_$kind" --steps 0 \
           --quiet --peak-flops 1e11 >/dev/null 2>"$W/err" &&
       $MT logits --ckpt "$W/i_$kind" --ids "$IDS" --out "$W/i_$kind.logits" >/dev/null 2>>"$W/err"; then
        "$PY" "$HERE/check_peft.py" peft_vs_mt "$W/pm_$kind/peft_logits.npy" "$W/i_$kind.logits" &&
            ok "peft $kind: PEFT adapter -> train --lora-from: logits == PEFT's" || bad "peft $kind: --lora-from logits"
        if $MT export --ckpt "$W/i_$kind" --out "$W/i_$kind.ad" --adapter --hf-layout $TMAJ >/dev/null 2>"$W/err"; then
            "$PY" "$HERE/check_peft.py" same "$W/pm_$kind" "$W/i_$kind.ad" &&
                ok "peft $kind: PEFT -> meshtrain -> PEFT: adapter tensors bit-identical" || bad "peft $kind: round trip tensors"
        else bad "peft $kind: export of the imported adapter ($(cat "$W/err"))"; fi
    else bad "peft $kind: train --lora-from the PEFT adapter ($(cat "$W/err"))"; fi
done <<'ROWS'
dense AA q,k,v,o,gate,up,down q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
moe EE q,v,expert q_proj,v_proj,gate_proj,up_proj,down_proj
mixed AE q,v,gate,up,down,expert q_proj,v_proj,gate_proj,up_proj,down_proj
mixed_attn AE q,k,v,o,expert q_proj,k_proj,v_proj,o_proj
ROWS
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
