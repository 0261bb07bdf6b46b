#!/usr/bin/env python3
"""fuzz_loaders.py BUILD_DIR [--seed S] [--cases N] [--timeout T] [--only NAME,...]

A mutation fuzzer for every loader of meshtrain (issue 33): config (train's
JSON config, through `plan --config`), manifest (a checkpoint's
manifest.json, through `logits --ckpt`), safetensors header (through
`import --hf`), tokenizer.bin (through `tokenizer encode`) and token shard
(through `train --data`). Each target starts from a valid file made here and
applies N seeded mutations (byte flips, truncation, extension, and for the
JSON formats structured edits: values replaced by extreme numbers, strings,
nulls, arrays; keys dropped or duplicated; for safetensors the offsets
shifted, swapped or made fractional). Every case runs the command under a
timeout and is classified:
  ok      exit 0 or 2 (accepted, or refused as bad input), no signal
  wrong   another exit code (1: a runtime failure on bad input; 3+)
  crash   killed by a signal (segfault, abort: exit 128+N or negative)
  hang    the timeout expired
Prints one line per target and the first failing cases, and exits 1 if any
case crashed, hung or got a wrong exit code. Fixed seed: the same cases
every run. CI runs a short budget (tests/test_fuzz_loaders.sh: 40 cases per
target); a long run on demand: `--cases 2000`.
"""
import json, os, random, shutil, struct, subprocess, sys, tempfile

def args():
    a = sys.argv[1:]
    if not a: raise SystemExit(__doc__)
    o = {"build": a[0], "seed": 33, "cases": 25, "timeout": 20.0, "only": None}
    i = 1
    while i < len(a):
        k = a[i]
        if k == "--seed": o["seed"] = int(a[i + 1])
        elif k == "--cases": o["cases"] = int(a[i + 1])
        elif k == "--timeout": o["timeout"] = float(a[i + 1])
        elif k == "--only": o["only"] = a[i + 1].split(",")
        else: raise SystemExit("unknown option %s\n%s" % (k, __doc__))
        i += 2
    return o

O = args()
MT = os.path.join(O["build"], "meshtrain")
W = tempfile.mkdtemp(prefix="mt_fuzz_")
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMP_NUM_THREADS="1")
TINY = ["--set", "vocab_size=64", "--set", "n_layer=2", "--set", "d_model=32", "--set", "n_head=4",
        "--set", "n_kv_head=2", "--set", "seq_len=16", "--set", "batch_size=4", "--set", "warmup_steps=2"]

def sh(cmd, timeout=None):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, timeout=timeout or O["timeout"],
                           stdin=subprocess.DEVNULL)
        return p.returncode, p.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return None, "timeout"

def must(cmd):
    rc, err = sh(cmd, 300)
    if rc != 0: raise SystemExit("setup failed: %s: %s" % (" ".join(cmd), err))

# ---- the valid starting points ----
shard = os.path.join(W, "train.bin")
must([sys.executable, os.path.join(HERE, "make_shard.py"), shard, "20000", "64", "pattern"])
run = os.path.join(W, "run")
must([MT, "train"] + TINY + ["--data", shard, "--out", run, "--steps", "2", "--quiet", "--peak-flops", "1e11"])
ck = os.path.join(run, "ckpt", sorted(d for d in os.listdir(os.path.join(run, "ckpt")) if d.startswith("step_"))[-1])
hf = os.path.join(W, "hf")
must([MT, "export", "--ckpt", ck, "--out", hf])
corpus = os.path.join(W, "corpus.txt")
open(corpus, "w").write("the quick brown fox jumps over the lazy dog\n" * 200)
tok = os.path.join(W, "tok.bin")
must([MT, "tokenizer", "train", "--input", corpus, "--vocab", "300", "--out", tok])
config = json.dumps({"vocab_size": 64, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "seq_len": 16,
                     "batch_size": 4, "lr": 0.01, "pattern": "AE", "n_experts": 4, "top_k": 2}).encode()

EXTREME = [0, -1, 1, 2, 0.5, -0.5, 1e308, -1e308, 2 ** 31, 2 ** 53 + 1, 2 ** 64, "", "x", "A" * 300, None, True,
           [], [1, 2], {}, {"a": 1}]

def mutate_bytes(rng, b):
    b = bytearray(b)
    k = rng.randrange(5)
    if k == 0 and b:                       # flip a few bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif k == 1:                           # truncate
        b = b[:rng.randrange(len(b) + 1)]
    elif k == 2:                           # extend
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif k == 3 and len(b) > 8:            # duplicate a slice
        i = rng.randrange(len(b)); j = min(len(b), i + rng.randint(1, 64)); b[i:i] = b[i:j]
    elif b:                                # zero a run
        i = rng.randrange(len(b)); b[i:i + rng.randint(1, 32)] = bytes(min(32, len(b) - i))
    return bytes(b)

def walk(o, path=()):
    yield path, o
    if isinstance(o, dict):
        for k, v in o.items(): yield from walk(v, path + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o): yield from walk(v, path + (i,))

def mutate_json(rng, o):
    """One structured edit of a JSON value (in place on a copy)."""
    o = json.loads(json.dumps(o))
    nodes = [(p, v) for p, v in walk(o) if p]
    if not nodes: return o
    p, _ = rng.choice(nodes)
    parent = o
    for k in p[:-1]: parent = parent[k]
    k = rng.randrange(4)
    if k == 0: parent[p[-1]] = rng.choice(EXTREME)
    elif k == 1 and isinstance(parent, dict): del parent[p[-1]]
    elif k == 2 and isinstance(parent[p[-1]], (int, float)) and not isinstance(parent[p[-1]], bool):
        parent[p[-1]] = parent[p[-1]] + rng.choice([1, -1, 4, 64, 0.5, -(2 ** 40)])
    else: parent[p[-1]] = rng.choice(EXTREME)
    return o

def json_text(rng, o):
    t = json.dumps(o)
    if rng.random() < 0.15 and isinstance(o, dict) and o:   # a duplicate key, as raw text
        k = rng.choice(list(o)); t = t[:-1] + ', %s: %s}' % (json.dumps(k), json.dumps(rng.choice(EXTREME)))
    return t.encode()

# ---- the targets: each returns the command for one mutated case ----
def t_config(rng, i):
    c = json.loads(config)
    f = os.path.join(W, "cfg.json")
    data = json_text(rng, mutate_json(rng, c)) if rng.random() < 0.7 else mutate_bytes(rng, config)
    open(f, "wb").write(data)
    return [MT, "plan", "--config", f, "--world", "1"]

def t_manifest(rng, i):
    d = os.path.join(W, "mck")
    shutil.rmtree(d, ignore_errors=True); shutil.copytree(ck, d)
    raw = open(os.path.join(ck, "manifest.json"), "rb").read()
    data = json_text(rng, mutate_json(rng, json.loads(raw))) if rng.random() < 0.7 else mutate_bytes(rng, raw)
    open(os.path.join(d, "manifest.json"), "wb").write(data)
    return [MT, "logits", "--ckpt", d, "--ids", "1,2,3", "--out", os.path.join(W, "l_%d.safetensors" % i)]

def t_safetensors(rng, i):
    d = os.path.join(W, "mhf")
    shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    shutil.copy(os.path.join(hf, "config.json"), d)
    b = open(os.path.join(hf, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h, data = json.loads(b[8:8 + n]), b[8 + n:]
    r = rng.random()
    if r < 0.3:        # offsets: shift, swap, fraction, overlap
        names = [k for k in h if k != "__metadata__"]
        a = rng.choice(names); o = h[a]["data_offsets"]
        e = rng.randrange(4)
        if e == 0: h[a]["data_offsets"] = [o[0] + 4, o[1] + 4]
        elif e == 1: h[a]["data_offsets"] = [o[1], o[0]]
        elif e == 2: h[a]["data_offsets"] = [o[0] + 0.5, o[1]]
        else:
            c = rng.choice(names); h[c]["data_offsets"] = list(o)
        out = json_text(rng, h)
    elif r < 0.7: out = json_text(rng, mutate_json(rng, h))
    else: out = None
    if out is None: blob = mutate_bytes(rng, b)
    else:
        out += b" " * (-len(out) % 8)
        blob = struct.pack("<Q", len(out)) + out + (mutate_bytes(rng, data) if rng.random() < 0.2 else data)
    open(os.path.join(d, "model.safetensors"), "wb").write(blob)
    o = os.path.join(W, "imp_%d" % i)
    return [MT, "import", "--hf", d, "--out", o]

def t_tokenizer(rng, i):
    f = os.path.join(W, "mtok.bin")
    open(f, "wb").write(mutate_bytes(rng, open(tok, "rb").read()))
    return [MT, "tokenizer", "encode", "--tokenizer", f, "--input", corpus, "--output", os.path.join(W, "ids.txt")]

def t_shard(rng, i):
    f = os.path.join(W, "mshard.bin")
    b = open(shard, "rb").read()
    # the header (first 1 KiB) more often than the body
    if rng.random() < 0.6:
        head = bytearray(b[:1024])
        for _ in range(rng.randint(1, 4)):
            j = rng.randrange(0, 32, 4)
            head[j:j + 4] = struct.pack("<i", rng.choice([0, -1, 1, 2 ** 31 - 1, 20240520, 64, 10 ** 9, 19999]))
        b = bytes(head) + b[1024:]
    else: b = mutate_bytes(rng, b)
    open(f, "wb").write(b)
    return [MT, "train"] + TINY + ["--data", f, "--out", os.path.join(W, "o_%d" % i), "--steps", "1", "--quiet",
                                  "--peak-flops", "1e11", "--no-save"]

TARGETS = [("config", t_config), ("manifest", t_manifest), ("safetensors", t_safetensors),
           ("tokenizer.bin", t_tokenizer), ("token shard", t_shard)]
bad_total = 0
for name, fn in TARGETS:
    if O["only"] and name not in O["only"]: continue
    rng = random.Random("%d:%s" % (O["seed"], name))
    count = {"ok": 0, "wrong": 0, "crash": 0, "hang": 0}
    refused = 0
    first = []
    for i in range(O["cases"]):
        cmd = fn(rng, i)
        rc, err = sh(cmd)
        kind = "hang" if rc is None else "crash" if rc < 0 or rc >= 128 else "ok" if rc in (0, 2) else "wrong"
        count[kind] += 1
        refused += rc == 2
        if kind != "ok" and len(first) < 3:
            first.append("case %d: %s (rc %s): %s" % (i, kind, rc, err.strip().splitlines()[-1][:200] if err.strip() else ""))
    bad = count["wrong"] + count["crash"] + count["hang"]
    bad_total += bad
    print("%-13s %4d cases: %d ok (%d refused, exit 2), %d wrong exit code, %d crashes, %d hangs%s" % (
        name, O["cases"], count["ok"], refused, count["wrong"], count["crash"], count["hang"], "" if not bad else ": FAIL"))
    for f in first: print("    " + f)
shutil.rmtree(W, ignore_errors=True)
sys.exit(1 if bad_total else 0)
