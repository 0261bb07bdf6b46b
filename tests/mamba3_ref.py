#!/usr/bin/env python3
"""mamba3_ref.py DIR — an independent numpy (float64) reference of the Mamba-3
SISO mixer (SPEC section 1c as the reference mamba3_simple.py computes it),
checked against the C forward that `test_mamba3 --dump DIR` wrote.

Files in DIR: dims.txt "D H P G N B T"; weights.f32 (float32, in the order of
mt_mamba3_weights_bind: Win (W,D), Wout (D,E), dt_bias, A_log, D (H), gB, gC
(N), B_bias, C_bias (H,N), g_out (E)); h.f32 (B*T, D); out.f32 (B*T, D).
Exit 0 when max|out_C - out_ref| / max(1, max|out_ref|) <= 1e-5, else 1;
2 on bad input.
"""
import sys
import numpy as np


def rmsnorm(v, eps):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)


def softplus(v):
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def rotate_half(u, ang):
    # pairs (k, k + N/2), the reference's apply_rotary_emb
    half = u.shape[-1] // 2
    c, s = np.cos(ang), np.sin(ang)
    u1, u2 = u[..., :half], u[..., half:]
    return np.concatenate([u1 * c - u2 * s, u1 * s + u2 * c], axis=-1)


def mixer(h, w, D, H, P, G, N, B, T):
    E = H * P
    proj = h @ w["Win"].T                                      # (B*T, W)
    proj = proj.reshape(B, T, -1)
    sizes = [E, E, G * N, G * N, H, H * N // 2, H]
    parts, o = [], 0
    for s in sizes:
        parts.append(proj[..., o:o + s])
        o += s
    z, xs, Br, Cr, dt_raw, theta, lam_raw = parts
    dt = softplus(dt_raw + w["dt_bias"])                       # (B,T,H)
    A = -np.exp(w["A_log"])                                    # (H)
    lam = sigmoid(lam_raw)
    Bn = rmsnorm(Br.reshape(B, T, G, N), 1e-5) * w["gB"]
    Cn = rmsnorm(Cr.reshape(B, T, G, N), 1e-5) * w["gC"]
    Bh = np.repeat(Bn, H // G, axis=2) + w["B_bias"]           # (B,T,H,N)
    Ch = np.repeat(Cn, H // G, axis=2) + w["C_bias"]
    ang = np.cumsum(theta.reshape(B, T, H, N // 2), axis=1)
    Bh, Ch = rotate_half(Bh, ang), rotate_half(Ch, ang)
    x = xs.reshape(B, T, H, P)
    y = np.zeros((B, T, H, P))
    for b in range(B):
        for hh in range(H):
            S = np.zeros((P, N))
            prev = None
            for t in range(T):
                a = np.exp(dt[b, t, hh] * A[hh])
                cur = np.outer(x[b, t, hh], Bh[b, t, hh])
                S = a * S + lam[b, t, hh] * dt[b, t, hh] * cur
                if prev is not None:
                    S = S + (1.0 - lam[b, t, hh]) * dt[b, t, hh] * a * prev
                prev = cur
                y[b, t, hh] = S @ Ch[b, t, hh] + w["D"][hh] * x[b, t, hh]
    y = y.reshape(B, T, E) * (z * sigmoid(z))
    y = rmsnorm(y.reshape(B, T, G, E // G), 1e-5).reshape(B, T, E) * w["g_out"]
    return y.reshape(B * T, E) @ w["Wout"].T


def main():
    if len(sys.argv) != 2:
        print("usage: mamba3_ref.py DIR", file=sys.stderr)
        return 2
    d = sys.argv[1]
    try:
        D, H, P, G, N, B, T = [int(v) for v in open(f"{d}/dims.txt").read().split()]
        flat = np.fromfile(f"{d}/weights.f32", dtype=np.float32).astype(np.float64)
        h = np.fromfile(f"{d}/h.f32", dtype=np.float32).astype(np.float64).reshape(B * T, D)
        out_c = np.fromfile(f"{d}/out.f32", dtype=np.float32).astype(np.float64).reshape(B * T, D)
    except (OSError, ValueError) as e:
        print(f"mamba3_ref: {e}", file=sys.stderr)
        return 2
    E = H * P
    W = 2 * E + 2 * G * N + H + H * N // 2 + H
    shapes = [("Win", (W, D)), ("Wout", (D, E)), ("dt_bias", (H,)), ("A_log", (H,)), ("D", (H,)),
              ("gB", (N,)), ("gC", (N,)), ("B_bias", (H, N)), ("C_bias", (H, N)), ("g_out", (E,))]
    w, o = {}, 0
    for name, shp in shapes:
        n = int(np.prod(shp))
        w[name] = flat[o:o + n].reshape(shp)
        o += n
    if o != flat.size:
        print(f"mamba3_ref: weights.f32 has {flat.size} floats, expected {o}", file=sys.stderr)
        return 2
    ref = mixer(h, w, D, H, P, G, N, B, T)
    err = np.max(np.abs(out_c - ref)) / max(1.0, np.max(np.abs(ref)))
    ok = err <= 1e-5
    print(f"{'ok  ' if ok else 'FAIL'} mamba3 C forward vs numpy reference: rel err {err:.2e} (tol 1e-05)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
