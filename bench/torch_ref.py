#!/usr/bin/env python3
"""bench/torch_ref.py — meshtrain's model family (docs/model.md) in PyTorch, written
for speed on the CPU, as the peer of the side-by-side benchmark (bench/vs_torch.sh).

Not a test: it times the full training step (forward, backward, clipping,
optimizers) with the config's model, batch and optimizer (Muon for the block
matrices + AdamW for the rest, or AdamW alone) and prints one JSON line
{"tokens_per_s": ..., "step_times_s": [...], ...}.

    torch_ref.py CONFIG.json [STEPS] [THREADS] [--mode eager|compiled]
                 [--data SHARD] [--precision fp32|bf16]
    torch_ref.py CONFIG.json --check MESHTRAIN [--data SHARD] [--mode ...] [--tol 2e-4]

What makes it a fair peer (issue 32 item 11: the previous version lost 3.3x to a
plain PyTorch model written independently):
- attention is F.scaled_dot_product_attention (causal; GQA by enable_gqa, so the
  K/V heads are never copied H/K times);
- RMSNorm (and QK-norm) is F.rms_norm, linears are F.linear (no transposed copies);
- AdamW is torch.optim.AdamW(fused=True) (one kernel for all its tensors);
  clipping uses the foreach norm; Muon groups every same-shaped matrix (experts
  included) once at start-up, and each step runs one batched Newton-Schulz
  (bmm) per shape group with foreach momentum/update ops: no Python loop over
  weights in the hot path;
- the MoE experts run on tokens sorted by expert (one argsort, contiguous
  slices), not one nonzero() scan per expert;
- torch.set_num_threads(THREADS) (= meshtrain's threads), one inter-op thread;
  glibc malloc keeps freed memory (mallopt, what meshtrain does for itself), so
  the big activations are not unmapped and faulted in again every step;
- --mode compiled: torch.compile (inductor, C++/OpenMP codegen on the CPU) of the
  model's loss and of the Muon update. Its compile time is reported apart
  ("compile_s") and its steps are timed after it.

Steps 0 and 1 are warm-up and excluded (as meshtrain's receipt does for >= 4
steps); in compiled mode the compiling steps are also excluded.

--check MESHTRAIN: numerics, so that a fast-but-wrong peer is caught. It runs
`MESHTRAIN train --steps 0` (the initial checkpoint) and `--steps 3` on the same
config and data shard (default: a random shard it writes), loads the initial
weights into this model, runs the same 3 steps on the same batches (meshtrain's
sequential data order) and compares loss and gradient norm of every step with
meshtrain's receipt: |diff| <= tol (loss, default 2e-5) and relative <= 5*tol
(grad norm), in fp32 (seen on a_dense and b_moe: 1.2e-6 and 1e-5 relative). Steps 1 and 2 see the weights after one and two optimizer steps (Muon,
AdamW, clipping, the cosine schedule), so the optimizers are checked as well
as the forward and backward. Exit 0 when all agree, 1 otherwise.
"""
import argparse
import ctypes
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

DEF = dict(head_dim=0, mlp_hidden=0, pattern="", n_experts=8, top_k=2, expert_hidden=0,
           shared_expert_hidden=0, aux_loss_coef=0.01, z_loss_coef=0.001, rope_theta=10000.0,
           norm_eps=1e-6, logit_softcap=0.0, batch_size=8, microbatches=1, optimizer="muon",
           lr=3e-3, muon_lr=0.02, muon_momentum=0.95, adam_beta1=0.9, adam_beta2=0.95,
           adam_eps=1e-8, weight_decay=0.0, grad_clip=1.0, warmup_steps=0, total_steps=0,
           min_lr_frac=0.0, lr_schedule="cosine", precision="fp32", seq_len=256)
NS_ABC = (3.4445, -4.7750, 2.0315)


def keep_freed_memory():
    """glibc: no mmap for big blocks, no trimming of the heap top, so a freed
    activation is reused by the next step instead of unmapped and page-faulted
    in again (meshtrain does the same with mallopt). M_TRIM_THRESHOLD=-1,
    M_TOP_PAD=-2, M_MMAP_THRESHOLD=-3 (max 32 MiB on 64-bit glibc), M_MMAP_MAX=-4."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)
        libc.mallopt(-2, 256 << 20)
        libc.mallopt(-4, 0)  # no mmap at all: larger blocks come from the heap too
        return True
    except OSError:
        return False


def resolve(c):
    """The derived sizes as meshtrain resolves them (config.md)."""
    D, H = c["d_model"], c["n_head"]
    c["head_dim"] = c["head_dim"] or D // H
    c["mlp_hidden"] = c["mlp_hidden"] or (int(math.ceil(8 * D / 3)) + 63) // 64 * 64
    c["expert_hidden"] = c["expert_hidden"] or c["mlp_hidden"] // 4
    c["pattern"] = c["pattern"] or "A" * c["n_layer"]
    if "M" in c["pattern"]:
        raise SystemExit("torch_ref.py: Mamba-3 (M) blocks are not modelled here")
    if c["shared_expert_hidden"]:
        raise SystemExit("torch_ref.py: a shared expert is not modelled here")
    return c


class Model(torch.nn.Module):
    """Parameter names are meshtrain's checkpoint names (the HF Qwen3 names)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        D, V, L, H, K, hd = c["d_model"], c["vocab_size"], c["n_layer"], c["n_head"], c["n_kv_head"], c["head_dim"]
        Fh, E, Fe = c["mlp_hidden"], c["n_experts"], c["expert_hidden"]
        self.H, self.K, self.hd, self.eps = H, K, hd, c["norm_eps"]
        self.pattern = c["pattern"]
        P = torch.nn.Parameter
        n = lambda *s: P(torch.randn(*s) * 0.02)
        self.wte, self.wlm, self.gf = n(V, D), n(V, D), P(torch.ones(D))
        self.layers = torch.nn.ModuleList()
        for l in range(L):
            m = torch.nn.Module()
            m.g1, m.g2, m.gq, m.gk = P(torch.ones(D)), P(torch.ones(D)), P(torch.ones(hd)), P(torch.ones(hd))
            m.wq, m.wk, m.wv, m.wo = n(H * hd, D), n(K * hd, D), n(K * hd, D), n(D, H * hd)
            if self.pattern[l] == "E":
                m.wr = n(E, D)
                m.eg, m.eu, m.ed = n(E, Fe, D), n(E, Fe, D), n(E, D, Fe)
            else:
                m.wg, m.wu, m.wd = n(Fh, D), n(Fh, D), n(D, Fh)
            with torch.no_grad():  # output projections scaled by 1/sqrt(2L), as meshtrain's init
                for w in (m.wo, m.ed if self.pattern[l] == "E" else m.wd):
                    w.mul_(1 / math.sqrt(2 * L))
            self.layers.append(m)
        T = c["seq_len"]
        inv = c["rope_theta"] ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
        self.register_buffer("cos", ang.cos().float()[:, None, :], persistent=False)  # (T, 1, hd/2)
        self.register_buffer("sin", ang.sin().float()[:, None, :], persistent=False)

    def ckpt_names(self):
        """meshtrain name -> parameter of this model."""
        out = {"model.embed_tokens.weight": self.wte, "lm_head.weight": self.wlm, "model.norm.weight": self.gf}
        for l, m in enumerate(self.layers):
            p = f"model.layers.{l}."
            out.update({p + "input_layernorm.weight": m.g1, p + "post_attention_layernorm.weight": m.g2,
                        p + "self_attn.q_proj.weight": m.wq, p + "self_attn.k_proj.weight": m.wk,
                        p + "self_attn.v_proj.weight": m.wv, p + "self_attn.o_proj.weight": m.wo,
                        p + "self_attn.q_norm.weight": m.gq, p + "self_attn.k_norm.weight": m.gk})
            if self.pattern[l] == "E":
                out[p + "mlp.gate.weight"] = m.wr
                for e in range(self.c["n_experts"]):
                    q = f"{p}mlp.experts.{e}."
                    out[q + "gate_proj.weight"] = (m.eg, e)
                    out[q + "up_proj.weight"] = (m.eu, e)
                    out[q + "down_proj.weight"] = (m.ed, e)
            else:
                out.update({p + "mlp.gate_proj.weight": m.wg, p + "mlp.up_proj.weight": m.wu,
                            p + "mlp.down_proj.weight": m.wd})
        return out

    def rope(self, x):  # x (B, T, h, hd): rotate-half pairs (i, i + hd/2)
        x1, x2 = x.chunk(2, -1)
        return torch.cat((x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin), -1)

    def moe(self, m, h):
        """Dropless top-k MoE: tokens sorted by expert, one contiguous GEMM chain per expert."""
        c = self.c
        B, T, D = h.shape
        E, k = c["n_experts"], c["top_k"]
        x = h.reshape(-1, D)
        logits = F.linear(x, m.wr).float()
        p = logits.softmax(-1)
        g, idx = p.topk(k, -1)  # ties: the lower index first, as meshtrain
        g = g / g.sum(-1, keepdim=True)
        out = self.experts(m, x, g, idx)
        f = torch.zeros(B, E, dtype=p.dtype, device=p.device).scatter_add_(   # on h's device (GPU peer too)
            1, idx.reshape(B, T * k), torch.ones(B, T * k, dtype=p.dtype, device=p.device)) / (T * k)
        P_ = p.reshape(B, T, E).mean(1)
        aux = c["aux_loss_coef"] * E * (f * P_).sum(-1).mean()
        z = c["z_loss_coef"] * torch.logsumexp(logits, -1).pow(2).mean()
        return out.reshape(B, T, D), aux, z

    @torch.compiler.disable
    def experts(self, m, x, g, idx):
        """Eager even under --mode compiled: the per-expert token counts change every
        step, and static-shape graphs would recompile each step (seen: minutes per step)."""
        k = idx.shape[-1]
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        tok = order // k
        counts = torch.bincount(flat, minlength=self.c["n_experts"])
        xs = x.index_select(0, tok).split(counts.tolist())
        # unbind: one stacked gradient per weight in backward (m.eg[e] would add E full-size zero-filled ones)
        ys = [F.linear(F.silu(F.linear(xe, wg)) * F.linear(xe, wu), wd)
              for xe, wg, wu, wd in zip(xs, m.eg.unbind(0), m.eu.unbind(0), m.ed.unbind(0))]
        y = torch.cat(ys) * g.reshape(-1).index_select(0, order)[:, None]
        return torch.zeros_like(x).index_add_(0, tok, y)

    def forward(self, idx, tgt):
        """-> (loss, lm_loss, aux, z)."""
        B, T = idx.shape
        H, K, hd, eps = self.H, self.K, self.hd, self.eps
        x = F.embedding(idx, self.wte)
        aux = z = x.new_zeros(())
        for l, m in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), m.g1, eps)
            q = self.rope(F.rms_norm(F.linear(h, m.wq).view(B, T, H, hd), (hd,), m.gq, eps))
            k = self.rope(F.rms_norm(F.linear(h, m.wk).view(B, T, K, hd), (hd,), m.gk, eps))
            v = F.linear(h, m.wv).view(B, T, K, hd)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=H != K)
            x = x + F.linear(y.transpose(1, 2).reshape(B, T, H * hd), m.wo)
            h = F.rms_norm(x, (x.shape[-1],), m.g2, eps)
            if self.pattern[l] == "E":
                y, a, zz = self.moe(m, h)
                aux, z = aux + a, z + zz
            else:
                y = F.linear(F.silu(F.linear(h, m.wg)) * F.linear(h, m.wu), m.wd)
            x = x + y
        logits = F.linear(F.rms_norm(x, (x.shape[-1],), self.gf, eps), self.wlm).float()
        sc = self.c["logit_softcap"]
        if sc > 0:
            logits = sc * torch.tanh(logits / sc)
        lm = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-1)
        return lm + aux + z, lm, aux, z


def newton_schulz(X):
    """Batched quintic Newton-Schulz on (n, rows, cols) with rows <= cols, fp32 (model.md):
    X /= ||X||_F + 1e-7; 5 x { A = X X^T; B = b A + c A A; X = a X + B X }."""
    a, b, c = NS_ABC
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + 1e-7)
    for _ in range(5):
        A = X @ X.mT
        X = a * X + torch.baddbmm(A, A, A, beta=b, alpha=c) @ X
    return X


class Muon:
    """Muon over same-shaped groups: each group's momentum is ONE (n, rows, cols)
    buffer; a step is foreach momentum, one stack of the grads, one batched
    Newton-Schulz and one foreach update per group (model.md, 'Muon per matrix')."""

    def __init__(self, params, c, compiled):
        self.c = c
        groups = {}
        for p in params:
            groups.setdefault(tuple(p.shape[-2:]), []).append(p)
        self.groups = []
        for (r, cc), ps in groups.items():
            n = sum(p.numel() // (r * cc) for p in ps)
            self.groups.append((ps, torch.zeros(n, r, cc), math.sqrt(max(1.0, r / cc)), r > cc))
        self.ortho = torch.compile(self._ortho, dynamic=False) if compiled else self._ortho

    def _ortho(self, G, M, mu, tr):
        M.mul_(mu).add_(G)
        X = G.add(M, alpha=mu)  # Nesterov: g + mu m
        X = newton_schulz(X.mT if tr else X)
        return X.mT if tr else X

    @torch.no_grad()
    def step(self, lr_factor):
        c = self.c
        lr, wd = c["muon_lr"] * lr_factor, c["weight_decay"]
        for ps, M, scale, tr in self.groups:
            G = torch.cat([p.grad.view(-1, *p.shape[-2:]) for p in ps])
            X = self.ortho(G, M, c["muon_momentum"], tr)
            if wd:
                torch._foreach_mul_(ps, 1 - lr * wd)
            outs, i = [], 0
            for p in ps:  # views, no copies
                n = p.numel() // (p.shape[-2] * p.shape[-1])
                outs.append(X[i:i + n].view(p.shape))
                i += n
            torch._foreach_add_(ps, outs, alpha=-lr * scale)


def lr_factor(c, s, steps):
    W, S, m = c["warmup_steps"], c["total_steps"] or steps, c["min_lr_frac"]
    if s < W:
        return (s + 1) / W
    prog = (s - W) / max(1, S - W)
    if c["lr_schedule"] == "linear":
        return 1 - (1 - m) * prog
    if c["lr_schedule"] == "constant":
        return 1.0
    return m + (1 - m) * (1 + math.cos(math.pi * prog)) / 2


class Trainer:
    def __init__(self, c, mode, steps):
        self.c, self.steps = c, steps
        self.model = Model(c)
        muon, adam_wd, adam = [], [], []
        for name, p in self.model.named_parameters():
            if c["optimizer"] == "muon" and name.startswith("layers.") and p.dim() >= 2 and not name.endswith(".wr"):
                muon.append(p)
            else:
                (adam_wd if p.dim() >= 2 else adam).append(p)
        self.params = list(self.model.parameters())
        kw = dict(lr=c["lr"], betas=(c["adam_beta1"], c["adam_beta2"]), eps=c["adam_eps"])
        try:
            self.adam = torch.optim.AdamW([dict(params=adam_wd, weight_decay=c["weight_decay"]),
                                           dict(params=adam, weight_decay=0.0)], fused=True, **kw)
            self.adam_impl = "fused"
        except (RuntimeError, ValueError):
            self.adam = torch.optim.AdamW([dict(params=adam_wd, weight_decay=c["weight_decay"]),
                                           dict(params=adam, weight_decay=0.0)], foreach=True, **kw)
            self.adam_impl = "foreach"
        self.muon = Muon(muon, c, mode == "compiled") if muon else None
        self.loss_fn = torch.compile(self.model, dynamic=False) if mode == "compiled" else self.model
        self.autocast = c["precision"] == "bf16"

    def step(self, s, idx, tgt):
        """One training step; -> (loss, lm, aux, z, grad_norm) as tensors."""
        c = self.c
        mb = c["microbatches"]
        tot = None
        for xi, ti in zip(idx.chunk(mb), tgt.chunk(mb)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                out = self.loss_fn(xi, ti)
            (out[0] / mb).backward()
            tot = [o.detach() / mb for o in out] if tot is None else [a + o.detach() / mb for a, o in zip(tot, out)]
        gn = torch.nn.utils.clip_grad_norm_(self.params, c["grad_clip"] if c["grad_clip"] > 0 else float("inf"),
                                            foreach=True)
        f = lr_factor(c, s, self.steps)
        for gr in self.adam.param_groups:
            gr["lr"] = c["lr"] * f
        self.adam.step()
        if self.muon:
            self.muon.step(f)
        for p in self.params:
            p.grad = None
        return tot + [gn]


def read_shard(path):
    with open(path, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
        return torch.frombuffer(bytearray(f.read(2 * h[2])), dtype=torch.int16).to(torch.int64) & 0xFFFF


def batch(tokens, s, B, T):
    """meshtrain's sequential order: sequence i of step s starts at ((s*B + i)*T) mod (N-T-1)."""
    M = tokens.numel() - T - 1
    starts = torch.tensor([((s * B + i) * T) % M for i in range(B)])
    w = tokens[starts[:, None] + torch.arange(T + 1)[None]]
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def load_ckpt(model, d):
    man = json.load(open(os.path.join(d, "manifest.json")))
    names = model.ckpt_names()
    blobs, seen = {}, 0
    with torch.no_grad():
        for t in man["tensors"]:
            if t["file"] != "params.bin":
                continue
            if t["name"] not in names:
                raise SystemExit(f"torch_ref.py: checkpoint tensor {t['name']} has no place in this model")
            if t["file"] not in blobs:
                blobs[t["file"]] = open(os.path.join(d, t["file"]), "rb").read()
            n = math.prod(t["shape"])
            v = torch.frombuffer(bytearray(blobs[t["file"]][t["offset"]:t["offset"] + 4 * n]),
                                 dtype=torch.float32).view(t["shape"])
            dst = names[t["name"]]
            (dst[0][dst[1]] if isinstance(dst, tuple) else dst).copy_(v)
            seen += 1
    if seen != len(names):
        raise SystemExit(f"torch_ref.py: the checkpoint set {seen} of {len(names)} tensors")
    return man["config"]


def check(args, c):
    """Compare 3 steps with meshtrain's on the same initial weights and batches."""
    tmp = tempfile.mkdtemp(prefix="torch_ref_check.")
    try:
        data = args.data
        if not data:
            data = os.path.join(tmp, "data.bin")
            make = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "make_shard.py")
            subprocess.run([sys.executable, make, data, "200000", str(c["vocab_size"]), "random"], check=True)
        base = [args.check, "train", "--config", args.config, "--data", data, "--quiet",
                "--set", "precision=fp32", "--set", "data_order=sequential"]
        run = lambda *a: subprocess.run(base + list(a), check=True, stdout=subprocess.DEVNULL)
        run("--out", os.path.join(tmp, "init"), "--steps", "0")
        run("--out", os.path.join(tmp, "run"), "--steps", "3", "--no-save")
        rc = json.load(open(os.path.join(tmp, "run", "receipt.json")))
        ck = os.path.join(tmp, "init", "ckpt", open(os.path.join(tmp, "init", "ckpt", "latest")).read().split()[0])
        cfg = resolve(dict(DEF, **{k: v for k, v in json.load(open(os.path.join(ck, "manifest.json")))["config"].items()
                                   if k in DEF or k in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head")}))
        cfg["precision"] = "fp32"
        tr = Trainer(cfg, args.mode, 3)
        load_ckpt(tr.model, ck)
        toks = read_shard(data)
        rows, ok = [], True
        for s in range(3):
            idx, tgt = batch(toks, s, cfg["batch_size"], cfg["seq_len"])
            loss, lm, aux, z, gn = (float(v) for v in tr.step(s, idx, tgt))
            ml, mg = rc["losses"][s], rc["grad_norms"][s]
            good = abs(loss - ml) <= args.tol and abs(gn - mg) <= 5 * args.tol * mg
            ok &= good
            rows.append(dict(step=s, torch_loss=loss, meshtrain_loss=ml, torch_grad_norm=gn, meshtrain_grad_norm=mg,
                             torch_aux=aux, meshtrain_aux=rc["aux_losses"][s], torch_z=z,
                             meshtrain_z=rc["z_losses"][s], ok=good))
        print(json.dumps(dict(check="ok" if ok else "MISMATCH", mode=args.mode, tol=args.tol,
                              config=args.config, data=data, steps=rows, meshtrain_git=rc["build"]["git"],
                              torch=torch.__version__)))
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("steps", nargs="?", type=int, default=10)
    ap.add_argument("threads", nargs="?", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    ap.add_argument("--data", help="llm.c token shard (uint16); default: random tokens")
    ap.add_argument("--precision", choices=("fp32", "bf16"), help="default: the config's (fp32)")
    ap.add_argument("--check", metavar="MESHTRAIN", help="compare 3 steps with this meshtrain binary (exit 1 if off)")
    ap.add_argument("--tol", type=float, default=2e-5, help="--check: loss tolerance (grad norm: 5x, relative)")
    args = ap.parse_args()
    malloc_tuned = keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(1337)
    c = dict(DEF)
    c.update(json.load(open(args.config)))
    resolve(c)
    if args.precision:
        c["precision"] = args.precision
    if args.check:
        sys.exit(check(args, c))
    B, T, V, steps = c["batch_size"], c["seq_len"], c["vocab_size"], args.steps
    tr = Trainer(c, args.mode, steps)
    toks = read_shard(args.data) if args.data else None
    times, first = [], None
    for s in range(steps):
        if toks is not None:
            idx, tgt = batch(toks, s, B, T)
        else:
            idx, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        out = tr.step(s, idx, tgt)
        loss = float(out[0])  # the step is done when its loss is known
        times.append(time.perf_counter() - t0)
        first = loss if first is None else first
    # warm-up: steps 0, 1 (meshtrain's receipt excludes the same); compiled: also
    # every step slower than 3x the fastest (a recompile), reported as compile time
    warm = 2 if steps >= 4 else (1 if steps >= 2 else 0)
    if args.mode == "compiled":
        while warm < steps - 2 and times[warm] > 3 * min(times[warm:]):
            warm += 1
    steady = sum(times[warm:])
    print(json.dumps({"tokens_per_s": B * T * (steps - warm) / steady, "step_times_s": times,
                      "warmup_steps_excluded": warm, "compile_s": sum(times[:warm]) if args.mode == "compiled" else 0.0,
                      "mode": args.mode, "precision": c["precision"], "loss_first": first, "loss_last": loss,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "adamw": tr.adam_impl, "malloc_keep_freed": malloc_tuned,
                      "blas": "mkl" if torch.backends.mkl.is_available() else "other",
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}))


if __name__ == "__main__":
    main()
