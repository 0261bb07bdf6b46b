#!/usr/bin/env python3
"""bench/torch_ref.py — the SPEC.md model in plain PyTorch, for the side-by-side
benchmark (bench/vs_torch.sh). Not a test: it measures the full training step
(forward, backward, clipping, optimizer) on random tokens with the config's
batch and optimizer (Muon for the block matrices + AdamW for the rest, or AdamW
alone), and prints one JSON line {"tokens_per_s": ..., "step_times_s": [...]}.

Usage: /usr/bin/python3 bench/torch_ref.py CONFIG.json [STEPS] [THREADS]
(Debian's python3-torch lives under /usr/bin/python3.) Steps 0 and 1 are warm-up
and excluded, as in meshtrain's receipt (warmup_steps_excluded = 2 for >= 4 steps).
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

DEF = dict(head_dim=0, mlp_hidden=0, pattern="", n_experts=8, top_k=2, expert_hidden=0,
           aux_loss_coef=0.01, z_loss_coef=0.001, rope_theta=10000.0, norm_eps=1e-6,
           logit_softcap=0.0, optimizer="muon", lr=3e-3, muon_lr=0.02, muon_momentum=0.95,
           grad_clip=1.0)


def rms(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope(x, cos, sin):  # x (B,T,nh,hd), rotate-half
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        D, V, L = c["d_model"], c["vocab_size"], c["n_layer"]
        H, K = c["n_head"], c["n_kv_head"]
        hd = c["head_dim"] or D // H
        F_ = c["mlp_hidden"] or (int(8 * D / 3) + 63) // 64 * 64
        Fe = c["expert_hidden"] or F_ // 4
        self.H, self.K, self.hd = H, K, hd
        self.pattern = c["pattern"] or "A" * L
        P = torch.nn.Parameter
        n = lambda *s: P(torch.randn(*s) * 0.02)
        self.wte, self.wlm, self.gf = n(V, D), n(V, D), P(torch.ones(D))
        self.layers = torch.nn.ModuleList()
        for l in range(L):
            m = torch.nn.Module()
            m.g1, m.g2, m.gq, m.gk = P(torch.ones(D)), P(torch.ones(D)), P(torch.ones(hd)), P(torch.ones(hd))
            m.wq, m.wk, m.wv, m.wo = n(H * hd, D), n(K * hd, D), n(K * hd, D), n(D, H * hd)
            if self.pattern[l] == "E":
                E = c["n_experts"]
                m.wr = n(E, D)
                m.eg, m.eu, m.ed = n(E, Fe, D), n(E, Fe, D), n(E, D, Fe)
            else:
                m.wg, m.wu, m.wd = n(F_, D), n(F_, D), n(D, F_)
            self.layers.append(m)
        T = c["seq_len"]
        inv = c["rope_theta"] ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
        self.register_buffer("cos", ang.cos().float()[None, :, None, :])
        self.register_buffer("sin", ang.sin().float()[None, :, None, :])
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1))

    def moe(self, m, h):
        c = self.c
        B, T, D = h.shape
        x = h.reshape(-1, D)
        logits = x @ m.wr.t()
        p = logits.softmax(-1)
        g, idx = p.topk(c["top_k"], -1)
        g = g / g.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(c["n_experts"]):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x[rows]
            ye = (F.silu(xe @ m.eg[e].t()) * (xe @ m.eu[e].t())) @ m.ed[e].t()
            out.index_add_(0, rows, ye * g[rows, slot, None])
        E = c["n_experts"]
        f = F.one_hot(idx, E).float().reshape(B, T * c["top_k"], E).mean(1)
        P_ = p.reshape(B, T, E).mean(1)
        aux = c["aux_loss_coef"] * E * (f * P_).sum(-1).mean()
        z = c["z_loss_coef"] * torch.logsumexp(logits, -1).pow(2).mean()
        return out.reshape(B, T, D), aux + z

    def forward(self, idx, tgt):
        c, eps = self.c, self.c["norm_eps"]
        B, T = idx.shape
        H, K, hd = self.H, self.K, self.hd
        x = self.wte[idx]
        extra = 0.0
        for l, m in enumerate(self.layers):
            h = rms(x, m.g1, eps)
            q = rope(rms((h @ m.wq.t()).view(B, T, H, hd), m.gq, eps), self.cos, self.sin)
            k = rope(rms((h @ m.wk.t()).view(B, T, K, hd), m.gk, eps), self.cos, self.sin)
            v = (h @ m.wv.t()).view(B, T, K, hd)
            if H != K:
                k = k.repeat_interleave(H // K, 2)
                v = v.repeat_interleave(H // K, 2)
            y = self.attend(q, k, v)
            x = x + y.transpose(1, 2).reshape(B, T, H * hd) @ m.wo.t()
            h = rms(x, m.g2, eps)
            if self.pattern[l] == "E":
                y, a = self.moe(m, h)
                extra = extra + a
            else:
                y = (F.silu(h @ m.wg.t()) * (h @ m.wu.t())) @ m.wd.t()
            x = x + y
        z = rms(x, self.gf, eps) @ self.wlm.t()
        sc = c["logit_softcap"]
        if sc > 0:
            z = sc * torch.tanh(z / sc)
        return self.xent(z.view(-1, z.shape[-1]), tgt.view(-1)) + extra

    def attend(self, q, k, v):
        """Causal attention, q k v (B, T, H, hd) -> (B, H, T, hd). torch 1.13 has no
        scaled_dot_product_attention: the plain softmax(q k^T) v form (bench/torch_gpu.py overrides it)."""
        T, hd = q.shape[1], q.shape[3]
        att = (q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
        return att @ v.transpose(1, 2)

    def xent(self, logits, tgt):
        return F.cross_entropy(logits, tgt)


def newton_schulz(d):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = d.t() if d.shape[0] > d.shape[1] else d
    X = X / (X.norm() + 1e-7)
    for _ in range(5):
        A = X @ X.t()
        X = a * X + (b * A + c * A @ A) @ X
    return X.t() if d.shape[0] > d.shape[1] else X


def main():
    c = dict(DEF)
    c.update(json.load(open(sys.argv[1])))
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    torch.manual_seed(1337)
    model = Model(c)
    B, T, V = c["batch_size"], c["seq_len"], c["vocab_size"]
    muon, adam = [], []
    for name, p in model.named_parameters():
        (muon if c["optimizer"] == "muon" and name.startswith("layers.") and p.dim() >= 2
         and not name.endswith(".wr") else adam).append(p)
    opt = torch.optim.AdamW(adam, lr=c["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    mom = [torch.zeros_like(p) for p in muon]
    times = []
    for s in range(steps):
        idx = torch.randint(0, V, (B, T))
        tgt = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
        opt.step()
        with torch.no_grad():
            for p, m in zip(muon, mom):
                mats = p.grad if p.dim() == 2 else p.grad.unbind(0)
                ms = m if p.dim() == 2 else m.unbind(0)
                ps = p if p.dim() == 2 else p.unbind(0)
                for pi, gi, mi in ([(p, p.grad, m)] if p.dim() == 2 else zip(ps, mats, ms)):
                    mi.mul_(c["muon_momentum"]).add_(gi)
                    X = newton_schulz(gi + c["muon_momentum"] * mi)
                    pi.add_(X, alpha=-c["muon_lr"] * math.sqrt(max(1.0, pi.shape[0] / pi.shape[1])))
        times.append(time.perf_counter() - t0)
    warm = 2 if steps >= 4 else (1 if steps >= 2 else 0)
    steady = sum(times[warm:])
    print(json.dumps({"tokens_per_s": B * T * (steps - warm) / steady, "step_times_s": times,
                      "loss_last": float(loss), "torch": torch.__version__,
                      "threads": torch.get_num_threads(),
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}))


if __name__ == "__main__":
    main()
