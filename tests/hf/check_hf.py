#!/usr/bin/env python3
"""check_hf.py — the transformers side of tests/hf/check.sh (needs torch and
transformers; run with the virtual environment's python).

  check_hf.py export EXPORT_DIR MT_LOGITS IDS MT_GREEDY
      AutoModelForCausalLM on a meshtrain export: logits on IDS vs
      `meshtrain logits`, and greedy generation vs `meshtrain sample
      --temperature 0 --prompt-ids` (MT_GREEDY: its output, whose first 8
      ids are the prompt).
  check_hf.py tokenizer EXPORT_DIR TEXTS_JSON MT_IDS_JSON
      AutoTokenizer on the export: ids of each text vs `meshtrain tokenizer encode`.
  check_hf.py make KIND OUT_DIR VOCAB
      a random Qwen3 (KIND=dense, tied embeddings, no head_dim key) or Qwen3-MoE
      (KIND=moe) saved by transformers' save_pretrained.
  check_hf.py hf_logits HF_DIR MT_LOGITS IDS
      HF logits of a saved model vs `meshtrain logits` of its import.
  check_hf.py hf_loss HF_DIR DATA_DIR T B MT_RECEIPT
      HF's mean next-token loss over the first B sequences of T+1 tokens of the
      data dir's train stream vs the receipt's step-0 lm loss.
Prints one line per number; exits 1 on a mismatch beyond the tolerances.
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

torch.manual_seed(0)
TOL = 1e-4   # logits: float32 both sides, different summation orders


def st_load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, e in h.items():
        if k == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype="<f4").reshape(e["shape"])
    return out


def load(d):
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)   # `dtype`: transformers >= 4.56
    m.eval()
    return m


def ids_of(s):
    return [int(x) for x in s.replace(",", " ").split()]


def hf_logits(m, ids):
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].double().numpy()


def main():
    mode = sys.argv[1]
    ver = transformers.__version__
    fail = False
    if mode == "export":
        d, mt_path, ids, greedy = sys.argv[2], sys.argv[3], ids_of(sys.argv[4]), ids_of(sys.argv[5])
        m = load(d)
        ref = st_load(mt_path)["logits"].astype(np.float64)
        got = hf_logits(m, ids)
        diff = float(np.max(np.abs(got - ref)))
        print(f"  transformers {ver}: {type(m).__name__} logits ({len(ids)}, {got.shape[1]}) max |diff| vs meshtrain {diff:.3g} "
              f"(max |logit| {np.max(np.abs(ref)):.3g})")
        fail |= not diff <= TOL
        prompt = greedy[:8]
        with torch.no_grad():
            out = m.generate(torch.tensor([prompt]), max_new_tokens=len(greedy) - len(prompt), do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=len(greedy) - len(prompt))
        g = out[0].tolist()
        same = g == greedy
        print(f"  greedy {len(greedy) - len(prompt)} tokens from {len(prompt)} prompt ids: {'identical' if same else 'DIFFERENT'}"
              + ("" if same else f" (hf {g} vs meshtrain {greedy})"))
        fail |= not same
    elif mode == "tokenizer":
        d, texts, mt_ids = sys.argv[2], json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
        tok = AutoTokenizer.from_pretrained(d)
        n_ok = 0
        for t, want in zip(texts, mt_ids):
            got = tok.encode(t, add_special_tokens=False)
            if got == want:
                n_ok += 1
            else:
                print(f"  DIFFERENT for {t!r}: hf {got} vs meshtrain {want}")
                fail = True
            back = tok.decode(got)
            if back != t:
                print(f"  decode({t!r}) gave {back!r}")
                fail = True
        print(f"  transformers {ver}: {type(tok).__name__} vocab {len(tok)}: {n_ok}/{len(texts)} texts encode to "
              f"meshtrain's ids and decode back; bos/eos {tok.bos_token!r}/{tok.eos_token!r}")
    elif mode == "make":
        kind, out, V = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if kind == "dense":
            cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                           rope_theta=1e6, tie_word_embeddings=True)
        else:
            cfg = transformers.Qwen3MoeConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0],
                                              rope_theta=1e6, tie_word_embeddings=False)
        m = AutoModelForCausalLM.from_config(cfg).float()
        with torch.no_grad():   # HF inits norms to 1 and leaves q/k norms trivial: randomise them too
            for n, p in m.named_parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.05 * torch.randn_like(p))
        m.save_pretrained(out)
        c = json.load(open(f"{out}/config.json"))
        if kind == "dense":   # head_dim left to HF's default (128, not D/H = 16): drop the key
            c.pop("head_dim", None)
            json.dump(c, open(f"{out}/config.json", "w"), indent=2)
        print(f"  transformers {ver}: saved a random {type(m).__name__} ({sum(p.numel() for p in m.parameters())} params); "
              f"config keys: {'rope_parameters' if 'rope_parameters' in c else 'rope_theta'}, "
              f"{'head_dim=' + str(c.get('head_dim')) if 'head_dim' in c else 'no head_dim'}, "
              f"files {sorted(os.listdir(out))}")
    elif mode == "hf_logits":
        d, mt_path, ids = sys.argv[2], sys.argv[3], ids_of(sys.argv[4])
        m = load(d)
        got = hf_logits(m, ids)
        ref = st_load(mt_path)["logits"].astype(np.float64)
        diff = float(np.max(np.abs(got - ref)))
        print(f"  transformers {ver}: HF {type(m).__name__} -> meshtrain import: logits max |diff| {diff:.3g} "
              f"(max |logit| {np.max(np.abs(got)):.3g})")
        fail |= not diff <= TOL
    elif mode == "hf_loss":
        d, data, T, B, rec = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
        toks = []
        for f in sorted(os.listdir(data)):
            if f.endswith(".bin") and f != "tokenizer.bin" and "val" not in f:
                b = open(f"{data}/{f}", "rb").read()
                n = struct.unpack("<3i", b[:12])[2]
                toks += list(struct.unpack(f"<{n}H", b[1024:1024 + 2 * n]))
        m = load(d)
        x = torch.tensor([toks[i * T:i * T + T + 1] for i in range(B)])
        with torch.no_grad():
            lg = m(x[:, :T]).logits.double()
        loss = float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1)))
        r = json.load(open(rec))
        mt = r["lm_losses"][0]
        print(f"  transformers {ver}: step-0 loss on {B}x{T} tokens: HF {loss:.7f}, meshtrain train --init-from {mt:.7f}, "
              f"|diff| {abs(loss - mt):.2g}")
        fail |= not abs(loss - mt) <= 1e-5 * max(1.0, loss)
    else:
        raise SystemExit(__doc__)
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
