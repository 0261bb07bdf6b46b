#!/usr/bin/env python3
"""check_peft.py — the PEFT side of tests/hf/check.sh's PEFT stage (needs torch,
transformers and peft; run with the virtual environment's python).

  check_peft.py load ADAPTER_DIR MT_LOGITS IDS
      AutoPeftModelForCausalLM.from_pretrained(ADAPTER_DIR) (the base comes from
      adapter_config.json's base_model_name_or_path): no missing / unexpected
      keys and no "did not match" warning, then logits on IDS vs `meshtrain
      logits` of the LoRA run.
  check_peft.py make BASE_HF TARGETS OUT_DIR
      a PEFT LoRA adapter (r 4, alpha 8, TARGETS comma-separated module names,
      A and B random: init_lora_weights=False; on transformers 5 the fused
      gate_up_proj's B block-diagonal) on the base, saved with
      save_pretrained; OUT_DIR/peft_logits.npy: its logits on the ids in
      OUT_DIR/ids.txt (written by the caller).
  check_peft.py same ADAPTER_A ADAPTER_B
      the adapter tensors of two adapter folders: the same names, bit-identical.
Prints one line per number; exits 1 on a mismatch beyond the tolerances.
"""
import json
import struct
import sys
import warnings

import numpy as np
import torch
import transformers
import peft

torch.manual_seed(0)
TOL = 1e-4   # logits: float32 both sides, different summation orders


def st_raw(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: (e["dtype"], e["shape"], b[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
            for k, e in h.items() if k != "__metadata__"}


def ids_of(s):
    return [int(x) for x in s.replace(",", " ").split()]


def logits(m, ids):
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].double().numpy()


def main():
    mode = sys.argv[1]
    ver = f"transformers {transformers.__version__} + peft {peft.__version__}"
    fail = False
    if mode == "load":
        d, mt_path, ids = sys.argv[2], sys.argv[3], ids_of(sys.argv[4])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            m = peft.AutoPeftModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        m.eval()
        # peft 0.21's own conversion of per-expert adapters adds rank/alpha patterns for the fused
        # gate_up_proj and then warns that they "did not match" (they do apply: the logits below);
        # any other such warning, or a missing / unexpected key, fails
        noisy = [str(x.message) for x in w if any(s in str(x.message).lower()
                                                  for s in ("missing", "unexpected", "did not match"))]
        benign = [s for s in noisy if "did not match" in s and "gate_up_proj" in s
                  and s.count("'") == 2]
        for s in noisy:
            print(f"  {'note (peft conversion)' if s in benign else 'WARNING'} from the load: {s[:200]}")
        fail |= len(noisy) > len(benign)
        ref = np.frombuffer(st_raw(mt_path)["logits"][2], dtype="<f4").reshape(len(ids), -1).astype(np.float64)
        got = logits(m, ids)
        with m.disable_adapter():
            base = logits(m, ids)
        diff = float(np.max(np.abs(got - ref)))
        n_lora = sum(1 for k, _ in m.named_parameters() if ".lora_" in k)
        print(f"  {ver}: PEFT on {type(m.get_base_model()).__name__} ({n_lora} LoRA tensors) logits max |diff| vs "
              f"meshtrain {diff:.3g} (max |logit| {np.max(np.abs(ref)):.3g}; the adapters move them by up to "
              f"{np.max(np.abs(got - base)):.3g})")
        fail |= not diff <= TOL
    elif mode == "make":
        base, targets, out = sys.argv[2], sys.argv[3].split(","), sys.argv[4]
        ids = ids_of(open(f"{out}/ids.txt").read())
        b = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, bias="none",
                              init_lora_weights=False, task_type="CAUSAL_LM")
        m = peft.get_peft_model(b, cfg)
        E = getattr(b.config, "num_experts", 0) or 0
        with torch.no_grad():   # B random but small: the adapter moves the logits by O(0.1)
            for k, p in m.named_parameters():
                if ".lora_" in k:
                    p.mul_(0.3)
                if "experts.base_layer.lora_B" in k:
                    # transformers 5's fused gate_up_proj (rank 2r): keep it a gate and an up adapter
                    # (B block-diagonal per expert, column j E + e; what peft's conversion of per-expert
                    # adapters gives): a full rank-2r B is one adapter on [gate; up], which meshtrain's
                    # per-projection adapters cannot hold (--lora-from refuses it)
                    two_i, cols = p.shape
                    slot = torch.arange(cols) // E
                    off = (torch.arange(two_i)[:, None] < two_i // 2) != (slot[None, :] < cols // E // 2)
                    p[off] = 0
        m.eval()
        np.save(f"{out}/peft_logits.npy", logits(m, ids))
        m.save_pretrained(out)
        names = sorted(st_raw(f"{out}/adapter_model.safetensors"))
        print(f"  {ver}: saved a PEFT adapter on {targets}: {len(names)} tensors (e.g. {names[0]})")
    elif mode == "same":
        a, b = st_raw(f"{sys.argv[2]}/adapter_model.safetensors"), st_raw(f"{sys.argv[3]}/adapter_model.safetensors")
        same = set(a) == set(b) and all(a[k][1] == b[k][1] and np.array_equal(
            np.frombuffer(a[k][2], dtype="<f4" if a[k][0] == "F32" else "<u2"),
            np.frombuffer(b[k][2], dtype="<f4" if b[k][0] == "F32" else "<u2")) and a[k][0] == b[k][0] for k in a)
        print(f"  {len(a)} adapter tensors: {'bit-identical' if same else 'DIFFERENT'}"
              + ("" if same else f" (only in one: {sorted(set(a) ^ set(b))[:4]})"))
        fail |= not same
    elif mode == "peft_vs_mt":
        pl, mt_path = np.load(sys.argv[2]), sys.argv[3]
        ref = np.frombuffer(st_raw(mt_path)["logits"][2], dtype="<f4").reshape(pl.shape).astype(np.float64)
        diff = float(np.max(np.abs(pl - ref)))
        print(f"  {ver}: PEFT-made adapter, its PEFT logits vs meshtrain logits after --lora-from: max |diff| "
              f"{diff:.3g} (max |logit| {np.max(np.abs(ref)):.3g})")
        fail |= not diff <= TOL
    else:
        raise SystemExit(f"unknown mode {mode}")
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
