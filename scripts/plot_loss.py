#!/usr/bin/env python3
"""plot_loss.py RECEIPT PNG: train and val loss against tokens seen."""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

r = json.load(open(sys.argv[1]))
tps = r["batch"]["tokens_per_step"]
steps = r["steps"]
plt.figure(figsize=(7, 4))
plt.plot([(s + 1) * tps for s in steps], r["losses"], label="train", lw=1)
if r.get("val_losses"):
    v = r["val_losses"]
    ntok = v[0].get("tokens")   # the val tokens each point is the mean over (eval_batches x batch x seq_len)
    label = f"val ({ntok:,.0f} tokens scored)" if ntok else "val"
    plt.plot([e["step"] * tps for e in v], [e["loss"] for e in v], "o-", label=label)
    print(f"val: {len(v)} evaluations, each over {ntok:,.0f} tokens" if ntok else f"val: {len(v)} evaluations")
plt.xlabel("tokens"); plt.ylabel("loss"); plt.legend(); plt.grid(alpha=0.3)
plt.title(f"meshtrain: {r['parameters']['total']/1e6:.1f}M params, {r['timing']['tokens_per_s']:.0f} tok/s")
plt.tight_layout(); plt.savefig(sys.argv[2], dpi=120)
print("wrote", sys.argv[2])
