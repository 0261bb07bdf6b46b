#!/usr/bin/env python3
"""check_predictions.py [BUILD_DIR] [OUT_JSON] — the cost model against receipts.

Runs a set of `meshtrain train` configurations on this machine (one rank with
all cores, and 2 or 4 MPI ranks with one thread each), then asks
`meshtrain plan --json --profile cpu-local` for the same setup and compares
the predicted step time with the receipt's best steady step (the first 2
steps excluded). This machine is shared and has minutes when it runs several
times slower (identical runs: 0.61 s vs 6 s per step); the best step keeps
those out, and the mean steady step is kept in OUT_JSON too.

Each configuration runs REPS times (default 3), interleaved, and the best
steady step over all repetitions is the measurement (the profile's
efficiency is calibrated the same way, bench/profiles/measure_cpu.sh); the
mean steady step of the repetitions is shown too.
The profile's efficiency is re-calibrated on this session's first row (a
dense on one rank: no communication, so its step scales exactly as
1/efficiency), and every other row is a prediction with that efficiency.
Prints a markdown table (docs/plan.md) and writes the raw numbers to OUT_JSON;
`check_predictions.py BUILD OUT_JSON --from` re-plans saved measurements.
"""
import json, os, subprocess, sys, tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
OUTJ = sys.argv[2] if len(sys.argv) > 2 else None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MT = os.path.join(ROOT, BUILD, "meshtrain")
PROFILE = os.path.join(ROOT, "bench", "profiles", "cpu-local.json")
STEPS = int(os.environ.get("STEPS", "8"))

TINY = ["--set", "vocab_size=64", "--set", "n_layer=2", "--set", "d_model=32", "--set", "n_head=4",
        "--set", "n_kv_head=4", "--set", "seq_len=16", "--set", "batch_size=8"]
A, B, C = "bench/configs/a_dense.json", "bench/configs/b_moe.json", "bench/configs/c_gpt2small.json"
# (label, np, config file or None, extra --set args, mesh, zero)
RUNS = [
    ("a dense", 1, A, [], "dp=1", 0),
    ("a dense, recompute=block", 1, A, ["--set", "recompute=block"], "dp=1", 0),
    ("b moe", 1, B, [], "dp=1", 0),
    ("c gpt2-small (5 steps)", 1, C, [], "dp=1", 0),
    ("a dense", 2, A, [], "dp=2", 0),
    ("a dense", 2, A, [], "dp=2", 1),
    ("a dense", 2, A, [], "dp=2", 3),
    ("a dense", 2, A, [], "tp=2", 0),
    ("a dense, 4 microbatches", 2, A, ["--set", "microbatches=4"], "pp=2", 0),
    ("b moe", 2, B, [], "ep=2", 1),
    ("a dense (2 ranks per core)", 4, A, [], "dp=2,tp=2", 1),
    ("tiny dense (d=32, 2 layers)", 2, None, TINY, "dp=2", 0),
]


def run(cmd, env=None):
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stdout[-2000:]))
    return r.stdout


def main():
    tmp = tempfile.mkdtemp(prefix="mt-pred-")
    data = os.path.join(tmp, "data.bin")
    run(["python3", "tests/make_shard.py", data, "400000", "8192", "random"])
    tiny = os.path.join(tmp, "tiny.bin")
    run(["python3", "tests/make_shard.py", tiny, "20000", "64", "pattern"])
    prof = json.load(open(PROFILE))
    reps = int(os.environ.get("REPS", "3"))
    best = {}
    for rep in range(reps):
        for i, (label, np_, cfg, extra, mesh, zero) in enumerate(RUNS):
            out = os.path.join(tmp, "r%d_%d" % (i, rep))
            steps = 5 if "gpt2" in label else STEPS
            args = (["--config", cfg] if cfg else []) + extra
            train = [MT, "train"] + args + ["--data", tiny if cfg is None else data, "--out", out, "--steps",
                                           str(steps), "--mesh", mesh, "--zero", str(zero), "--quiet",
                                           "--peak-flops", "1e11"]
            env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
            if np_ > 1:
                env["OMP_NUM_THREADS"] = "1"
                train = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-x", "OMP_NUM_THREADS", "-np",
                         str(np_)] + train
            else:
                env["OMP_NUM_THREADS"] = str(os.cpu_count())
            run(train, env)
            rec = json.load(open(os.path.join(out, "receipt.json")))
            tm = rec["timing"]
            steady = tm["step_times_s"][tm["warmup_steps_excluded"]:]
            split = tm["step_time_split_s"]
            b = best.setdefault(i, {"best": 1e30, "means": [], "comm": 1e30})
            b["best"] = min(b["best"], min(steady))
            b["means"].append(sum(steady) / len(steady))
            b["comm"] = min(b["comm"], split["communication"] / tm["steps_run"])
            b["args"], b["steps"] = args, steps
    report(prof, best, tmp, reps)


def predict(best, profile_path):
    rows = []
    for i, (label, np_, cfg, extra, mesh, zero) in enumerate(RUNS):
        b = best[i]
        plan = [MT, "plan"] + b["args"] + ["--world", str(np_), "--mesh", mesh, "--zero", str(zero), "--steps",
                                          str(b["steps"]), "--json", "--profile", profile_path]
        c = json.loads(run(plan))["cost"]
        mean = sum(b["means"]) / len(b["means"])
        rows.append({"label": label, "ranks": np_, "mesh": mesh, "zero": zero, "measured_step_s": b["best"],
                     "measured_mean_step_s": mean, "predicted_step_s": c["step_s"],
                     "measured_comm_s_per_step": b["comm"],
                     "predicted_comm_s": c["tp_comm_s"] + c["ep_comm_s"] + c["pp_comm_s"] + c["dp_exposed_s"],
                     "predicted": c})
    return rows


def report(prof, best, tmp, reps):
    # Calibrate the efficiency in this session: row 0 (a dense, one rank) has no
    # communication, so its predicted step scales exactly as 1/efficiency. The
    # other rows are then predictions.
    rows0 = predict(best, PROFILE)
    eff = prof["efficiency"] * rows0[0]["predicted_step_s"] / rows0[0]["measured_step_s"]
    cal = dict(prof, efficiency=float("%.3g" % eff))
    calpath = os.path.join(tmp, "calibrated.json")
    json.dump(cal, open(calpath, "w"))
    rows = predict(best, calpath)
    print("efficiency: profile %.3g, calibrated on this session's row 0: %.3g" % (prof["efficiency"], eff),
          file=sys.stderr)
    for r in rows:
        print("%-32s %d %-10s z%d  best %.4g s (mean %.4g)  predicted %.4g s (x%.2f)" % (
            r["label"], r["ranks"], r["mesh"], r["zero"], r["measured_step_s"], r["measured_mean_step_s"],
            r["predicted_step_s"], r["predicted_step_s"] / r["measured_step_s"]), file=sys.stderr)
    print("| run | ranks | mesh | ZeRO | best step s | mean step s | predicted s | predicted / best | comm best / predicted s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %s | %d | %s | %d | %.4g | %.4g | %.4g | %.2f | %.3g / %.3g |" % (
            r["label"], r["ranks"], r["mesh"], r["zero"], r["measured_step_s"], r["measured_mean_step_s"],
            r["predicted_step_s"], r["predicted_step_s"] / r["measured_step_s"], r["measured_comm_s_per_step"],
            r["predicted_comm_s"]))
    if OUTJ:
        best_s = {str(k): v for k, v in best.items()}
        json.dump({"profile": prof, "calibrated_efficiency": eff, "steps": STEPS, "reps": reps, "measured": best_s,
                   "runs": rows}, open(OUTJ, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[3] == "--from":
        # re-plan saved measurements (OUT_JSON of an earlier run) with the current profile
        saved = json.load(open(sys.argv[2]))
        OUTJ = None
        report(json.load(open(PROFILE)), {int(k): v for k, v in saved["measured"].items()}, tempfile.mkdtemp(),
               saved["reps"])
    else:
        main()
