#!/usr/bin/env python3
"""bench/torch_gpu.py — the SPEC.md model in PyTorch on a GPU, for bench/gpu.sh
(issue 20): bench/torch_ref.py's Model as it is (SDPA causal attention with
enable_gqa, F.rms_norm/F.linear, fp32 logits and loss, MoE on expert-sorted
tokens; the sizes resolved by torch_ref.resolve), its total loss alone, with
bf16 autocast, fused AdamW on every parameter (the gpu configs use
optimizer=adamw; one pass over the whole batch, the config's microbatches
ignored) and, with --compile, torch.compile of the model.

Not a test: it times full training steps (forward, backward, clip, optimizer)
on random tokens with the config's batch and prints ONE JSON line:
  {"mode": "eager"|"compiled", "tokens_per_s": ..., "step_times_s": [...],
   "peak_mem_bytes": ..., "device": ..., "torch": ..., "error": null|"..."}
A failure (OOM, compile error) is reported in "error" with exit 0, so the
caller's other stages run on.

Usage: python3 bench/torch_gpu.py CONFIG.json [--steps N] [--compile] [--fp32] [--device cpu]
                                 [--tiny] [--set KEY=VALUE ...]
       python3 bench/torch_gpu.py --check
A check of the script on the CPU: --device cpu --tiny (the config's pattern at width 64).
Steps before `warm` (2 eager, 4 compiled: compilation happens in the first
steps) are excluded from tokens_per_s.

Hybrid configs (an `M` in the pattern, e.g. gpu_d2048_dense.json with
pattern=MAMAMAMAMAMAMAMA; bench/gpu.sh's hyb2048): an `M` layer is the
Mamba-3 SISO mixer of docs/mamba3.md §1 (in-projection split z|xs|B|C|dt|
theta|lam, softplus dt, sigmoid lam, B/C group RMSNorm + per-head bias +
data-dependent rotate-half rotary, the trapezoidal scan, D skip, gated group
RMSNorm, out-projection) + the dense MLP, as meshtrain's `M` block. The scan
runs in the chunked SSD form of docs/mamba3.md §3 in plain torch ops (each
chunk's 2q sources, the masked decay L, two batched matmuls intra-chunk, the
chunk states and the inter-chunk pass by a (chunks x chunks) decay matrix),
its backward by autograd; the recurrence would be T sequential steps.
`--check` (CPU torch, float64, tiny shapes) checks the chunked scan against
the plain recurrence (chunks 1, 7, 64, T not a multiple of the chunk; outputs
and gradients) and, when numpy is there, the whole mixer against
tests/mamba3_ref.py's independent numpy reference; exit 0 when all pass.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (the model definition shared with the CPU bench)


MAMBA_DEF = dict(mamba_expand=2, mamba_headdim=64, mamba_d_state=64, mamba_ngroups=1, mamba_chunk=64)
# --tiny: the config's layer pattern at a CPU-sized width (a check of the script, no timing claim)
TINY = dict(vocab_size=512, d_model=64, n_head=4, n_kv_head=4, head_dim=0, mlp_hidden=128, expert_hidden=64,
            seq_len=64, batch_size=2, mamba_headdim=16, mamba_d_state=16, mamba_chunk=16)


def rms(x, g, eps):
    """RMSNorm over the last dim, x * rsqrt(mean(x^2) + eps) * g, as torch_ref.Model's F.rms_norm
    (g a tensor, or 1.0 for no weight)."""
    return F.rms_norm(x, (x.shape[-1],), g if torch.is_tensor(g) else None, eps)


def resolve(c):
    """torch_ref.resolve (meshtrain's derived sizes), which refuses an `M` in the pattern
    (torch_ref.Model has no Mamba-3 layer): resolved with the M layers as A, the pattern kept."""
    pat = c["pattern"]
    c.update(torch_ref.resolve(dict(c, pattern=pat.replace("M", "A"))))
    if "M" in pat:
        c["pattern"] = pat
    return c


def segsum(v):
    """v (..., n) -> (..., n, n): out[i, j] = sum_{k in (j, i]} v_k for j <= i, -inf above the
    diagonal (a masked cumsum, not a difference of cumsums: exact for long sequences)."""
    n = v.shape[-1]
    vv = v.unsqueeze(-1).expand(*v.shape, n)                              # vv[.., k, j] = v_k
    low = torch.ones(n, n, dtype=torch.bool, device=v.device)
    vv = vv.masked_fill(~low.tril(-1), 0)
    return torch.cumsum(vv, -2).masked_fill(~low.tril(0), float("-inf"))


def ssd_scan(x, Bh, Ch, dt, lam, A, Dsk, chunk):
    """The Mamba-3 trapezoidal scan in chunked (SSD) form (docs/mamba3.md §3).
    x (B,T,H,P), Bh Ch (B,T,H,N), dt lam (B,T,H), A Dsk (H) -> y (B,T,H,P):
        S_t = alpha_t S_{t-1} + gamma_t x_t Bh_t^T + beta_t x_{t-1} Bh_{t-1}^T,  y_t = S_t Ch_t + Dsk x_t
    alpha = exp(dt A), gamma = lam dt, beta = (1 - lam) dt alpha (0 at t = 0). A chunk of q
    tokens has 2q sources at times s(j) = j mod q: (x_s, Bh_s) weighted gamma_s and
    (x_{s-1}, Bh_{s-1}) weighted beta_s. The decays in fp32 (or the input dtype if wider)."""
    Bs, T, H, P = x.shape
    N = Bh.shape[-1]
    Q = max(1, min(chunk, T))
    nc = -(-T // Q)
    pad = nc * Q - T
    fdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    a = dt.to(fdt) * A.to(fdt)                                           # (B,T,H) log decay, <= 0
    gamma = lam * dt
    beta = (1 - lam) * dt * torch.exp(a).to(dt.dtype)
    beta = torch.cat([torch.zeros_like(beta[:, :1]), beta[:, 1:]], 1)     # no beta term at t = 0
    xp = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)            # x_{t-1}, Bh_{t-1}
    Bp = torch.cat([torch.zeros_like(Bh[:, :1]), Bh[:, :-1]], 1)
    if pad:   # padded tail: alpha 1, weights 0 (it never reaches a real output)
        padf = lambda v: F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad))
        x, xp, Bh, Bp, Ch, a, gamma, beta = (padf(v) for v in (x, xp, Bh, Bp, Ch, a, gamma, beta))
    r = lambda v: v.reshape(Bs, nc, Q, *v.shape[2:])
    x, xp, Bh, Bp, Ch, a, gamma, beta = (r(v) for v in (x, xp, Bh, Bp, Ch, a, gamma, beta))
    cum = torch.cumsum(a, 2)                                              # (B,c,Q,H) inclusive
    # E[i, s] = exp(cum_i - cum_s), s <= i (non-positive argument), else 0
    seg = cum.unsqueeze(3) - cum.unsqueeze(2)                             # (B,c,i,s,H)
    mask = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    Edec = torch.exp(seg.masked_fill(~mask[None, None, :, :, None], float("-inf")))
    # the 2q sources: values weighted, keys
    Xw = torch.cat([x * gamma.unsqueeze(-1), xp * beta.unsqueeze(-1)], 2)   # (B,c,2Q,H,P)
    Bc = torch.cat([Bh, Bp], 2)                                           # (B,c,2Q,H,N)
    L = torch.cat([Edec, Edec], 3).to(x.dtype)                            # (B,c,Q,2Q,H)
    # intra-chunk: Y = (C Bc^T o L) Xw, as batched matmuls over (B, c, H)
    Cm = Ch.permute(0, 1, 3, 2, 4)                                        # (B,c,H,Q,N)
    G = Cm @ Bc.permute(0, 1, 3, 4, 2)                                    # (B,c,H,Q,2Q)
    M = G * L.permute(0, 1, 4, 2, 3)
    y = M @ Xw.permute(0, 1, 3, 2, 4)                                     # (B,c,H,Q,P)
    # each chunk's own final state: Xw^T diag(v) Bc, v_j = E[q-1, s(j)]
    v = torch.exp(cum[:, :, -1:, :] - cum)                                # (B,c,Q,H)
    v2 = torch.cat([v, v], 2).to(x.dtype)
    Sc = (Xw * v2.unsqueeze(-1)).permute(0, 1, 3, 4, 2) @ Bc.permute(0, 1, 3, 2, 4)   # (B,c,H,P,N)
    # the states entering each chunk (the short pass over the chunks as one
    # (chunks x chunks) decay matrix): S_in[c] = sum_{d < c} exp(sum_{r in (d, c)} tot_r) Sc[d]
    tot = F.pad(cum[:, :, -1, :].permute(0, 2, 1), (1, 0))                # (B,H,c+1): 0, then each chunk's decay
    Wc = torch.exp(segsum(tot))[..., :nc, 1:].to(x.dtype)                 # (B,H,c,d)
    S_in = (Wc @ Sc.permute(0, 2, 1, 3, 4).reshape(Bs, H, nc, P * N)).reshape(Bs, H, nc, P, N)
    S_in = S_in.permute(0, 2, 1, 3, 4)                                    # (B,c,H,P,N)
    # inter-chunk: exp(cum_i) C_i S_in^T
    ein = torch.exp(cum).to(x.dtype).permute(0, 1, 3, 2).unsqueeze(-1)    # (B,c,H,Q,1)
    y = y + ein * (Cm @ S_in.transpose(-1, -2))                           # (B,c,H,Q,P)
    y = y.permute(0, 1, 3, 2, 4).reshape(Bs, nc * Q, H, P)[:, :T]
    x0 = x.reshape(Bs, nc * Q, H, P)[:, :T]
    return y + Dsk.view(1, 1, H, 1).to(y.dtype) * x0


def recurrence_scan(x, Bh, Ch, dt, lam, A, Dsk):
    """The same scan as the plain recurrence (the reference; T sequential steps)."""
    Bs, T, H, P = x.shape
    N = Bh.shape[-1]
    S = x.new_zeros(Bs, H, P, N)
    prev = None
    ys = []
    for t in range(T):
        al = torch.exp(dt[:, t] * A)                                      # (B,H)
        cur = x[:, t].unsqueeze(-1) * Bh[:, t].unsqueeze(-2)              # (B,H,P,N)
        S = al[..., None, None] * S + (lam[:, t] * dt[:, t])[..., None, None] * cur
        if prev is not None:
            S = S + ((1 - lam[:, t]) * dt[:, t] * al)[..., None, None] * prev
        prev = cur
        ys.append((S @ Ch[:, t].unsqueeze(-1)).squeeze(-1) + Dsk.view(1, H, 1) * x[:, t])
    return torch.stack(ys, 1)


def mamba3_mixer(m, h, c, scan=None):
    """docs/mamba3.md §1: h (B,T,D) -> (B,T,D) with layer m's parameters."""
    Bs, T, D = h.shape
    E, H, P, G, N = m.mE, m.mH, c["mamba_headdim"], c["mamba_ngroups"], c["mamba_d_state"]
    hi = lambda v: v if v.dtype == torch.float64 else v.float()   # the glue in fp32 (fp64 in --check)
    proj = F.linear(h, m.win)
    z, xs, Br, Cr, dt_raw, theta, lam_raw = torch.split(proj, [E, E, G * N, G * N, H, H * (N // 2), H], -1)
    dt = F.softplus(hi(dt_raw + m.dt_bias))
    A = -torch.exp(hi(m.A_log))
    lam = torch.sigmoid(hi(lam_raw))
    gn = lambda u, g: rms(hi(u).view(Bs, T, G, N), g, 1e-5)
    Bh = gn(Br, m.gB).repeat_interleave(H // G, 2) + m.B_bias
    Chh = gn(Cr, m.gC).repeat_interleave(H // G, 2) + m.C_bias
    ang = torch.cumsum(hi(theta).view(Bs, T, H, N // 2), 1)
    cos, sin = torch.cos(ang), torch.sin(ang)
    rot = lambda u: torch.cat([u[..., :N // 2] * cos - u[..., N // 2:] * sin,
                               u[..., :N // 2] * sin + u[..., N // 2:] * cos], -1)
    Bh, Chh = rot(Bh), rot(Chh)
    x = xs.view(Bs, T, H, P)
    if scan is None:
        y = ssd_scan(x, Bh.to(x.dtype), Chh.to(x.dtype), dt.to(x.dtype), lam.to(x.dtype), A, m.Dsk, c["mamba_chunk"])
    else:
        y = scan(x, Bh, Chh, dt, lam, A, m.Dsk)
    y = y.reshape(Bs, T, E) * F.silu(z)
    y = rms(hi(y).view(Bs, T, G, E // G), 1.0, 1e-5).view(Bs, T, E) * m.g_out
    return F.linear(y.to(h.dtype), m.wout)


def mamba3_params(m, c, D):
    """an M layer's mixer parameters (meshtrain's init scales: docs/mamba3.md, src/model/mamba.c)."""
    P_ = torch.nn.Parameter
    E = c["mamba_expand"] * D
    H, G, N = E // c["mamba_headdim"], c["mamba_ngroups"], c["mamba_d_state"]
    m.mE, m.mH = E, H
    W = 2 * E + 2 * G * N + H + H * (N // 2) + H
    m.win, m.wout = P_(torch.randn(W, D) * 0.02), P_(torch.randn(D, E) * 0.02)
    dt0 = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    m.dt_bias = P_(dt0 + torch.log(-torch.expm1(-dt0)))        # softplus^-1(dt0), dt0 in [1e-3, 0.1]
    m.A_log = P_(torch.log(torch.rand(H) * 15 + 1))            # A in [-16, -1]
    m.Dsk = P_(torch.ones(H))
    m.gB, m.gC = P_(torch.ones(N)), P_(torch.ones(N))
    m.B_bias, m.C_bias = P_(torch.ones(H, N)), P_(torch.ones(H, N))
    m.g_out = P_(torch.ones(E))


class GpuModel(torch_ref.Model):
    """torch_ref.Model as it is (SDPA causal with enable_gqa, F.rms_norm/F.linear, fp32 logits and
    loss, MoE on expert-sorted tokens), returning the total loss (lm + aux + z) alone."""

    def forward(self, idx, tgt):
        return super().forward(idx, tgt)[0]


class HybridModel(GpuModel):
    """GpuModel with the pattern's `M` layers as Mamba-3 mixer + dense MLP (meshtrain's `M` block);
    the A and E layers, the head and the loss as torch_ref.Model.forward."""

    def __init__(self, c):
        super().__init__(c)
        D = c["d_model"]
        for l, m in enumerate(self.layers):
            if self.pattern[l] == "M":
                for k in ("gq", "gk", "wq", "wk", "wv", "wo"):
                    delattr(m, k)
                mamba3_params(m, c, D)

    def forward(self, idx, tgt):
        c, eps = self.c, self.eps
        B, T = idx.shape
        H, K, hd = self.H, self.K, self.hd
        x = F.embedding(idx, self.wte)
        aux = z = x.new_zeros(())
        for l, m in enumerate(self.layers):
            h = rms(x, m.g1, eps)
            if self.pattern[l] == "M":
                x = x + mamba3_mixer(m, h, c)
            else:
                q = self.rope(rms(F.linear(h, m.wq).view(B, T, H, hd), m.gq, eps))
                k = self.rope(rms(F.linear(h, m.wk).view(B, T, K, hd), m.gk, eps))
                v = F.linear(h, m.wv).view(B, T, K, hd)
                y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True, enable_gqa=H != K)
                x = x + F.linear(y.transpose(1, 2).reshape(B, T, H * hd), m.wo)
            h = rms(x, m.g2, eps)
            if self.pattern[l] == "E":
                y, a, zz = self.moe(m, h)
                aux, z = aux + a, z + zz
            else:
                y = F.linear(F.silu(F.linear(h, m.wg)) * F.linear(h, m.wu), m.wd)
            x = x + y
        logits = F.linear(rms(x, self.gf, eps), self.wlm).float()
        sc = c["logit_softcap"]
        if sc > 0:
            logits = sc * torch.tanh(logits / sc)
        lm = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-1)
        return lm + aux + z


def run(cfg, steps, compile_, bf16, device="cuda"):
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(1337)
    # the model's constructor builds its buffers on the CPU, then moves
    model = (HybridModel if "M" in cfg["pattern"] else GpuModel)(cfg).to(dev)
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
    return times, float(loss.detach()), torch.cuda.max_memory_allocated() if cuda else 0


def check():
    """--check: the chunked scan vs the recurrence, the mixer vs tests/mamba3_ref.py (CPU, float64)."""
    torch.manual_seed(0)
    ok = True
    Bs, H, P, N = 2, 3, 4, 6
    for T, chunk in ((19, 1), (19, 7), (19, 64), (64, 7), (37, 16)):
        x, Bh, Ch = (torch.randn(Bs, T, H, d, dtype=torch.float64, requires_grad=True) for d in (P, N, N))
        dt = (torch.rand(Bs, T, H, dtype=torch.float64) * 0.5 + 0.01).requires_grad_()
        lam = torch.rand(Bs, T, H, dtype=torch.float64, requires_grad=True)
        A = (-torch.rand(H, dtype=torch.float64) * 4 - 0.5).requires_grad_()
        Dsk = torch.randn(H, dtype=torch.float64, requires_grad=True)
        ins = (x, Bh, Ch, dt, lam, A, Dsk)
        dy = torch.randn(Bs, T, H, P, dtype=torch.float64)
        y1 = ssd_scan(*ins, chunk)
        g1 = torch.autograd.grad((y1 * dy).sum(), ins)
        y0 = recurrence_scan(*ins)
        g0 = torch.autograd.grad((y0 * dy).sum(), ins)
        ey = ((y1 - y0).abs().max() / y0.abs().max()).item()
        eg = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in zip(g1, g0))
        good = ey <= 1e-10 and eg <= 1e-10
        ok = ok and good
        print("%s chunked scan vs recurrence T %d chunk %d: y rel %.2e, grads (x B C dt lam A D) rel %.2e"
              % ("PASS" if good else "FAIL", T, chunk, ey, eg))
    # the whole mixer vs the independent numpy reference (float64)
    try:
        import numpy as np
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        import mamba3_ref
    except ImportError as e:
        print("SKIPPED mixer vs tests/mamba3_ref.py (%s)" % e)
        return ok
    D, Bs, T = 16, 2, 21
    c = dict(MAMBA_DEF, mamba_expand=2, mamba_headdim=8, mamba_d_state=6, mamba_ngroups=2, mamba_chunk=5)
    m = torch.nn.Module()
    mamba3_params(m, c, D)
    with torch.no_grad():
        for p in m.parameters():   # away from the init's ones: every parameter matters
            p.add_(torch.randn_like(p) * 0.3)
    m = m.double()
    h = torch.randn(Bs, T, D, dtype=torch.float64)
    with torch.no_grad():
        out = mamba3_mixer(m, h, c).reshape(Bs * T, D).numpy()
    w = {k: getattr(m, a).detach().numpy() for k, a in (("Win", "win"), ("Wout", "wout"), ("dt_bias", "dt_bias"),
                                                       ("A_log", "A_log"), ("D", "Dsk"), ("gB", "gB"), ("gC", "gC"),
                                                       ("B_bias", "B_bias"), ("C_bias", "C_bias"), ("g_out", "g_out"))}
    ref = mamba3_ref.mixer(h.reshape(Bs * T, D).numpy(), w, D, m.mH, c["mamba_headdim"], c["mamba_ngroups"],
                           c["mamba_d_state"], Bs, T)
    e = float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))
    good = e <= 1e-10
    print("%s mixer (chunk 5, T 21, G 2) vs tests/mamba3_ref.py: max rel %.2e" % ("PASS" if good else "FAIL", e))
    return ok and good


def main():
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if check() else 1)
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fp32", action="store_true", help="no autocast (fp32 everywhere)")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script on a tiny config (no timing claim)")
    ap.add_argument("--tiny", action="store_true", help="the config's layer pattern at CPU size (TINY; with --device cpu)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (VALUE as JSON, else a string), after --tiny; repeatable")
    a = ap.parse_args()
    cfg = dict(torch_ref.DEF, **MAMBA_DEF)
    cfg.update(json.load(open(a.config)))
    if a.tiny:
        cfg.update(TINY)
    for kv in a.set:
        k, _, v = kv.partition("=")
        try:
            cfg[k] = json.loads(v)
        except ValueError:
            cfg[k] = v
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
        resolve(cfg)   # head_dim, mlp_hidden, expert_hidden, pattern as meshtrain derives them
        times, loss, peak = run(cfg, a.steps, a.compile, not a.fp32, a.device)
        warm = 4 if a.compile else 2
        warm = min(warm, len(times) - 1)
        B, T = cfg["batch_size"], cfg["seq_len"]
        out.update(tokens_per_s=B * T * (len(times) - warm) / sum(times[warm:]), step_times_s=times,
                   warmup_excluded=warm, loss_last=loss, peak_mem_bytes=peak, batch_size=B, seq_len=T)
    except (Exception, SystemExit) as e:  # report, do not stop the caller's other stages
        out["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
