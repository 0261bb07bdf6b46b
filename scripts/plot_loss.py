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
    plt.plot([e["step"] * tps for e in r["val_losses"]], [e["loss"] for e in r["val_losses"]], "o-", label="val")
plt.xlabel("tokens"); plt.ylabel("loss"); plt.legend(); plt.grid(alpha=0.3)
plt.title(f"meshtrain: {r['parameters']['total']/1e6:.1f}M params, {r['timing']['tokens_per_s']:.0f} tok/s")
plt.tight_layout(); plt.savefig(sys.argv[2], dpi=120)
print("wrote", sys.argv[2])
