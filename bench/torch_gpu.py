#!/usr/bin/env python3
"""bench/torch_gpu.py — the SPEC.md model in PyTorch on a GPU, for bench/gpu.sh
(issue 20): the same model as bench/torch_ref.py (whose Model it reuses) with
the attention replaced by F.scaled_dot_product_attention (causal, flash/
efficient kernels), bf16 autocast, fused AdamW on every parameter (the gpu
configs use optimizer=adamw) and, with --compile, torch.compile of the model.

Not a test: it times full training steps (forward, backward, clip, optimizer)
on random tokens with the config's batch and prints ONE JSON line:
  {"mode": "eager"|"compiled", "tokens_per_s": ..., "step_times_s": [...],
   "peak_mem_bytes": ..., "device": ..., "torch": ..., "error": null|"..."}
A failure (OOM, compile error) is reported in "error" with exit 0, so the
caller's other stages run on.

Usage: python3 bench/torch_gpu.py CONFIG.json [--steps N] [--compile] [--fp32] [--device cpu]
Steps before `warm` (2 eager, 4 compiled: compilation happens in the first
steps) are excluded from tokens_per_s.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (the model definition shared with the CPU bench)


class GpuModel(torch_ref.Model):
    """torch_ref.Model with SDPA attention and an fp32 loss (the rest is torch_ref's)."""

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True)

    def xent(self, logits, tgt):
        return F.cross_entropy(logits.float(), tgt)   # bf16 autocast logits: the loss in fp32


def run(cfg, steps, compile_, bf16, device="cuda"):
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(1337)
    # the model's constructor builds its buffers on the CPU, then moves
    model = GpuModel(cfg).to(dev)
    B, T, V = cfg["batch_size"], cfg["seq_len"], cfg["vocab_size"]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            fused=True)
    fwd = torch.compile(model) if compile_ else model
    times, loss = [], None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        idx = torch.randint(0, V, (B, T), device=dev)
        tgt = torch.randint(0, V, (B, T), device=dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    return times, float(loss), torch.cuda.max_memory_allocated() if cuda else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fp32", action="store_true", help="no autocast (fp32 everywhere)")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script on a tiny config (no timing claim)")
    a = ap.parse_args()
    cfg = dict(torch_ref.DEF)
    cfg.update(json.load(open(a.config)))
    mode = "compiled" if a.compile else "eager"
    out = {"config": os.path.basename(a.config), "mode": mode, "precision": "fp32" if a.fp32 else "bf16-autocast",
           "torch": torch.__version__, "device": None, "error": None}
    try:
        if a.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda.is_available() is False")
            out["device"] = torch.cuda.get_device_name(0)
        else:
            out["device"] = a.device
        times, loss, peak = run(cfg, a.steps, a.compile, not a.fp32, a.device)
        warm = 4 if a.compile else 2
        warm = min(warm, len(times) - 1)
        B, T = cfg["batch_size"], cfg["seq_len"]
        out.update(tokens_per_s=B * T * (len(times) - warm) / sum(times[warm:]), step_times_s=times,
                   warmup_excluded=warm, loss_last=loss, peak_mem_bytes=peak, batch_size=B, seq_len=T)
    except Exception as e:  # report, do not stop the caller's other stages
        out["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
