#!/usr/bin/env python3
"""ref_forward.py — the model of SPEC.md section 1, in numpy (float64), from an
exported Hugging Face folder alone (config.json + model.safetensors).

This is meshtrain's first reference for its model that is not its own code:
written from the spec (and the Qwen3 / Qwen3-MoE definitions it follows), it
reads nothing but the export, so it checks the forward, the export's names,
layouts and config keys at once.

    ref_forward.py compare HF_DIR MT_LOGITS.safetensors IDS [--atol 1e-5]
        forward over IDS (comma separated) and compare with `meshtrain logits`
        output: logits (after softcap), lm_loss, aux_loss, z_loss, and an MTP
        model's mtp_k_loss (meshtrain_mtp_depth, SPEC 1e) and a routed model's
        mod_aux_loss (meshtrain_mod_layers: Mixture-of-Depths, SPEC 1e).
    ref_forward.py greedy HF_DIR IDS P
        a routed (Mixture-of-Depths) model's greedy `meshtrain sample` of
        IDS[P:] after the prompt IDS[:P]: each id is the argmax of the forward
        with the sampling rule (a token runs a routed block iff r > 0).
    ref_forward.py uniform HF_DIR MT_LOGITS.safetensors
        the hand-computed case: every router weight is zero, so every token
        routes to experts 0..k-1 (ties go to the lower index), f = 1/k on
        them, P = 1/E, hence per MoE layer aux = coef * E * k * (1/k)(1/E) =
        coef and z = z_coef * ln(E)^2; checks meshtrain's terms against that.
"""
import json
import math
import struct
import sys

import numpy as np


def load_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, e in h.items():
        if k == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        raw = b[8 + n + lo:8 + n + hi]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        else:
            raise SystemExit(f"{path}: {k} has dtype {e['dtype']}")
        out[k] = a.astype(np.float64).reshape(e["shape"])
    return out


def load_hf(d):
    cfg = json.load(open(f"{d}/config.json"))
    return cfg, load_safetensors(f"{d}/model.safetensors")


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu(h, wg, wu, wd):
    return (silu(h @ wg.T) * (h @ wu.T)) @ wd.T


def rope(x, theta, pos=None):
    """x: (T, heads, hd); rotate-half pairs (i, i + hd/2); row t at position pos[t] (default t)."""
    T, _, hd = x.shape
    pos = np.arange(T) if pos is None else np.asarray(pos)
    inv = theta ** (-np.arange(0, hd // 2, dtype=np.float64) * 2.0 / hd)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]                  # (T, hd/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def rope_theta(cfg):
    if "rope_theta" in cfg:
        return float(cfg["rope_theta"])
    return float(cfg["rope_parameters"]["rope_theta"])


def mamba_mixer(cfg, W, p, h):
    """The Mamba-3 mixer of an M layer, by tests/mamba3_ref.py (the reference's
    single in_proj is the export's seven in_proj_* blocks concatenated)."""
    sys.path.insert(0, __file__.rsplit("/", 2)[0])
    import mamba3_ref
    D = cfg["hidden_size"]
    E = cfg["meshtrain_mamba_expand"] * D
    P, G, N = cfg["meshtrain_mamba_headdim"], cfg["meshtrain_mamba_ngroups"], cfg["meshtrain_mamba_d_state"]
    H = E // P
    blocks = ("z", "x", "B", "C", "dt", "theta", "lam")
    w = {"Win": np.concatenate([W[f"{p}in_proj_{b}.weight"] for b in blocks], axis=0),
         "Wout": W[p + "out_proj.weight"], "dt_bias": W[p + "dt_bias"], "A_log": W[p + "A_log"], "D": W[p + "D"],
         "gB": W[p + "B_norm.weight"], "gC": W[p + "C_norm.weight"], "B_bias": W[p + "B_bias"],
         "C_bias": W[p + "C_bias"], "g_out": W[p + "norm.weight"]}
    return mamba3_ref.mixer(h, w, D, H, P, G, N, 1, h.shape[0])


def attention(cfg, W, p, h, pos=None):
    """Causal GQA attention with QK-norm and RoPE over the rows of h (T, D) (row t at position pos[t],
    default t; rows in increasing position); p the layer's name prefix."""
    T = h.shape[0]
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim") or D // H
    eps, theta = float(cfg["rms_norm_eps"]), rope_theta(cfg)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd)
    kk = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, K, hd)
    v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, K, hd)
    q = rope(rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps), theta, pos)
    kk = rope(rmsnorm(kk, W[p + "self_attn.k_norm.weight"], eps), theta, pos)
    y = np.empty((T, H, hd))
    for j in range(H):                                                   # head j reads kv head j / (H/K)
        kv = j // (H // K)
        s = q[:, j, :] @ kk[:, kv, :].T / math.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        y[:, j, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
    return y.reshape(T, H * hd) @ W[p + "self_attn.o_proj.weight"].T


def ce_rows(logits, tgt):
    """Cross-entropy per row of logits (T, V) against tgt (T,), -1 ignored: (sum, count)."""
    m = logits.max(axis=1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    ok = tgt >= 0
    return -float(np.sum(lp[np.arange(len(tgt))[ok], tgt[ok]])), int(np.sum(ok))


def mtp_losses(cfg, W, ids, h0):
    """The MTP modules (SPEC 1e) on one sequence: [L_1, ..., L_Dm] as meshtrain reports them,
    (mtp_loss_coef / Dm) * mean CE over the rows with a target k ahead. h0: the last block's
    output before the final norm. Module blocks of kind A (attention + MLP) or M."""
    Dm = cfg.get("meshtrain_mtp_depth", 0)
    eps, cap = float(cfg["rms_norm_eps"]), float(cfg.get("meshtrain_logit_softcap", 0.0))
    T, D = h0.shape
    tgt = np.append(np.asarray(ids)[1:], -1)                            # tgt[i] = ids[i+1], the last none
    out, h = [], h0
    for k in range(1, Dm + 1):
        p = f"model.mtp.{k - 1}."
        e_ids = np.array([tgt[i + k - 1] if i + k - 1 < T and tgt[i + k - 1] >= 0 else 0 for i in range(T)])
        t_k = np.array([tgt[i + k] if i + k < T and tgt[i + k - 1] >= 0 else -1 for i in range(T)])
        hn = rmsnorm(h, W[p + "hnorm.weight"], eps)
        en = rmsnorm(W["model.embed_tokens.weight"][e_ids], W[p + "enorm.weight"], eps)
        x = np.concatenate([hn, en], axis=1) @ W[p + "eh_proj.weight"].T   # [h ; e] eh_proj^T
        b = p + "block."
        hb = rmsnorm(x, W[b + "input_layernorm.weight"], eps)
        x = x + (mamba_mixer(cfg, W, b + "mixer.", hb) if cfg.get("meshtrain_mtp_block", "A") == "M"
                 else attention(cfg, W, b, hb))
        hb = rmsnorm(x, W[b + "post_attention_layernorm.weight"], eps)
        x = x + swiglu(hb, W[b + "mlp.gate_proj.weight"], W[b + "mlp.up_proj.weight"], W[b + "mlp.down_proj.weight"])
        logits = rmsnorm(x, W[p + "norm.weight"], eps) @ W["lm_head.weight"].T
        if cap > 0:
            logits = cap * np.tanh(logits / cap)
        s, c = ce_rows(logits, t_k)
        out.append(float(cfg["meshtrain_mtp_loss_coef"]) / Dm * s / c)
        h = x
    return out


def forward(cfg, W, ids, decode=False):
    """Returns logits (T, V) after softcap, and (lm, aux, z, [mtp_1, ...]) as meshtrain defines them."""
    ids = np.asarray(ids)
    T = len(ids)
    eps = float(cfg["rms_norm_eps"])
    L = cfg["num_hidden_layers"]
    # a MeshtrainHybrid export (docs/export.md) names each layer's kind in meshtrain_pattern
    pattern = cfg.get("meshtrain_pattern") if cfg["model_type"] == "meshtrain_hybrid" else None
    moe = cfg["model_type"] == "qwen3_moe" or (pattern is not None and "E" in pattern.upper())
    E = cfg.get("num_experts", cfg.get("num_local_experts", 0)) if moe else 0
    k = cfg.get("num_experts_per_tok", 0)
    Z = cfg.get("meshtrain_n_null_experts", 0) if moe else 0            # null experts (SPEC 1e): router rows E..E+Z-1
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1)
    aux_coef = float(cfg.get("router_aux_loss_coef", 0.0))
    z_coef = float(cfg.get("meshtrain_z_loss_coef", 0.0))
    cap = float(cfg.get("meshtrain_logit_softcap", 0.0))
    aux = z = mod_aux = 0.0
    # Mixture-of-Depths (SPEC 1e): the routed layers, their capacity and aux weight
    mod_layers = set(cfg.get("meshtrain_mod_layers") or [])
    mod_c = float(cfg.get("meshtrain_mod_capacity", 1.0))
    mod_coef = float(cfg.get("meshtrain_mod_aux_coef", 0.0))

    def block(l, x, pos):
        """Layer l's block over rows x (n, D) at positions pos; returns its output and (aux, z) sums
        (MoE statistics over these n rows; z summed, divided by T by the caller's convention)."""
        p = f"model.layers.{l}."
        n = x.shape[0]
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        if pattern is not None and pattern[l] == "M":
            x = x + mamba_mixer(cfg, W, p + "mixer.", h)
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
            x = x + swiglu(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
            return x, 0.0, 0.0
        x = x + attention(cfg, W, p, h, pos)
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        sparse = moe and E > 0 and l not in mlp_only and (l + 1) % step == 0
        if pattern is not None:
            sparse = pattern[l] in "Ee"
        if not sparse:
            x = x + swiglu(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
            return x, 0.0, 0.0
        r = h @ W[p + "mlp.gate.weight"].T                               # (n, E + Z) router logits
        assert r.shape[1] == E + Z, (r.shape, E, Z)
        m = r.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(r - m).sum(axis=1, keepdims=True)))[:, 0]
        prob = np.exp(r - lse[:, None])
        out = np.zeros_like(h)
        f = np.zeros(E + Z)
        for t in range(n):
            pr = prob[t].copy()
            chosen = []
            for _ in range(k):                                           # k rounds of argmax, first max wins
                e = int(np.argmax(pr))
                chosen.append(e)
                pr[e] = -1.0
            g = prob[t, chosen] / prob[t, chosen].sum()
            for gate, e in zip(g, chosen):
                f[e] += 1.0
                if e >= E:                                               # a null expert: no computation, adds 0
                    continue
                q_ = f"{p}mlp.experts.{e}."
                out[t] += gate * swiglu(h[t:t + 1], W[q_ + "gate_proj.weight"], W[q_ + "up_proj.weight"],
                                        W[q_ + "down_proj.weight"])[0]
        if p + "mlp.shared_expert.gate_proj.weight" in W:                # meshtrain's ungated shared expert
            out += swiglu(h, W[p + "mlp.shared_expert.gate_proj.weight"], W[p + "mlp.shared_expert.up_proj.weight"],
                          W[p + "mlp.shared_expert.down_proj.weight"])
        f /= n * k                                                       # share of the n*k routing slots
        return x + out, aux_coef * (E + Z) * float(np.sum(f * prob.mean(axis=0))), z_coef * float(np.sum(lse ** 2))

    x = W["model.embed_tokens.weight"][ids]                              # (T, D)
    for l in range(L):
        if l not in mod_layers:
            x, a_, z_ = block(l, x, np.arange(T))
            aux, z = aux + a_, z + z_ / T
            continue
        # a routed layer: the C largest r = x . w (ties to the lower position) run the block, in order,
        # at their own positions; x += sigmoid(r) (y - x) on them; BCE(sigmoid(r), selected) per token
        r = x @ W[f"model.layers.{l}.mod.weight"]
        C = min(T, max(1, math.ceil(mod_c * T - 1e-6)))
        sel = np.sort(sorted(range(T), key=lambda t: (-r[t], t))[:C])
        if decode:                                                       # sampling: iff r > 0 (causal per token)
            sel = np.nonzero(r > 0)[0]
            if len(sel) == 0:
                continue
        y, a_, z_ = block(l, x[sel], sel)
        aux, z = aux + a_, z + z_ / T
        s = 1.0 / (1.0 + np.exp(-r))
        x = x.copy()
        x[sel] = x[sel] + s[sel, None] * (y - x[sel])
        chosen = np.zeros(T, dtype=bool)
        chosen[sel] = True
        sp = lambda v: np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))  # softplus
        mod_aux += mod_coef * float(np.mean(np.where(chosen, sp(-r), sp(r))))
    mtp = mtp_losses(cfg, W, ids, x) if cfg.get("meshtrain_mtp_depth", 0) else []
    h = rmsnorm(x, W["model.norm.weight"], eps)
    logits = h @ W["lm_head.weight"].T
    if cap > 0:
        logits = cap * np.tanh(logits / cap)
    m = logits.max(axis=1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    lm = -float(np.mean(lp[np.arange(T - 1), ids[1:]]))
    return logits, (lm, aux, z) + tuple(mtp) + ((mod_aux,) if mod_layers else ())


def main():
    mode = sys.argv[1]
    if mode == "compare":
        hf, mt_path, ids = sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].replace(",", " ").split()]
        atol = float(sys.argv[sys.argv.index("--atol") + 1]) if "--atol" in sys.argv else 1e-5
        cfg, W = load_hf(hf)
        ref, terms = forward(cfg, W, ids)
        mt = load_safetensors(mt_path)
        dl = float(np.max(np.abs(ref - mt["logits"])))
        bad = []
        if not dl <= atol:
            bad.append(f"logits max |diff| {dl:.3g} > {atol}")
        n_mtp = cfg.get("meshtrain_mtp_depth", 0)
        names = (("lm_loss", "aux_loss", "z_loss") + tuple(f"mtp_{k}_loss" for k in range(1, n_mtp + 1)) +
                 (("mod_aux_loss",) if cfg.get("meshtrain_mod_layers") else ()))
        assert len(names) == len(terms), (names, len(terms))
        for name, r in zip(names, terms):
            got = float(mt[name][0])
            d = abs(got - r)
            print(f"  {name}: meshtrain {got:.9g} reference {r:.9g} |diff| {d:.2g}")
            if not d <= atol * max(1.0, abs(r)):
                bad.append(f"{name} {got} vs {r}")
        print(f"  logits ({len(ids)}, {ref.shape[1]}): max |diff| {dl:.3g} (max |logit| {np.max(np.abs(ref)):.3g})")
        if bad:
            raise SystemExit("MISMATCH: " + "; ".join(bad))
    elif mode == "greedy":
        # greedy decoding of a routed model: each generated id (IDS[P:]) is the argmax of the reference
        # forward with the sampling rule (a token runs a routed block iff r > 0) at the position before it
        hf, ids, P = sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
        cfg, W = load_hf(hf)
        logits, _ = forward(cfg, W, ids, decode=True)
        for i in range(P - 1, len(ids) - 1):
            srt = np.sort(logits[i])
            top = int(np.argmax(logits[i]))
            if top != ids[i + 1] and srt[-1] - srt[-2] > 1e-5:
                raise SystemExit(f"MISMATCH: position {i}: reference argmax {top}, sampled {ids[i + 1]}")
        print(f"  generated {ids[P:]}: each the argmax of the reference's sampling-rule forward")
    elif mode == "uniform":
        hf, mt_path = sys.argv[2], sys.argv[3]
        cfg, W = load_hf(hf)
        n_moe = sum(1 for n in W if n.endswith("mlp.gate.weight"))
        for n in W:
            if n.endswith("mlp.gate.weight"):
                assert not W[n].any(), f"{n} is not zero"
        E = cfg.get("num_experts", cfg.get("num_local_experts"))
        aux = n_moe * float(np.float32(cfg["router_aux_loss_coef"]))
        z = n_moe * float(np.float32(cfg["meshtrain_z_loss_coef"])) * math.log(E) ** 2
        mt = load_safetensors(mt_path)
        ga, gz = float(mt["aux_loss"][0]), float(mt["z_loss"][0])
        print(f"  uniform routing, {n_moe} MoE layers, E={E}: aux {ga:.9g} (by hand {aux:.9g}), z {gz:.9g} (by hand {z:.9g})")
        if not (abs(ga - aux) <= 1e-6 * aux and abs(gz - z) <= 1e-6 * z):
            raise SystemExit("MISMATCH: aux/z terms differ from the hand-computed values")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
