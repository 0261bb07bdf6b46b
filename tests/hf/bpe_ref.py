#!/usr/bin/env python3
"""bpe_ref.py TOKENIZER_JSON TEXTS_JSON MT_IDS_JSON — run an exported
tokenizer.json the way Hugging Face `tokenizers` does, in plain Python (no
transformers), on ASCII texts, and compare with `meshtrain tokenizer encode`.

Split: the file's regex with \\p{L} -> [A-Za-z], \\p{N} -> [0-9] (exact for
ASCII; Python >= 3.11 for the possessive quantifiers); ByteLevel: GPT-2's
bytes_to_unicode; BPE: repeatedly merge the adjacent pair of lowest merge
rank (leftmost first) until none applies; ids from the vocab."""
import json
import re
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    tj = json.load(open(sys.argv[1]))
    texts, want = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
    pre = tj["pre_tokenizer"]["pretokenizers"]
    assert pre[0]["type"] == "Split" and pre[0]["behavior"] == "Isolated" and pre[1]["type"] == "ByteLevel"
    assert pre[1]["add_prefix_space"] is False and pre[1]["use_regex"] is False
    rx = pre[0]["pattern"]["Regex"].replace("\\p{L}", "A-Za-z").replace("\\p{N}", "0-9")
    # a bare class escape outside brackets needs its brackets back
    rx = rx.replace("]?+A-Za-z+", "]?+[A-Za-z]+").replace("|0-9{1,3}", "|[0-9]{1,3}")
    split = re.compile(rx)
    model = tj["model"]
    vocab, rank = model["vocab"], {tuple(m if isinstance(m, list) else m.split(" ")): i for i, m in enumerate(model["merges"])}
    assert sorted(vocab.values()) == list(range(len(vocab))), "vocab ids are not 0..V-1"
    for (a, b), i in rank.items():
        assert vocab[a + b] == 256 + i, f"merge {i} ({a!r}, {b!r}) is not token {256 + i}"
    b2u = bytes_to_unicode()
    assert all(vocab[b2u[b]] == b for b in range(256)), "single bytes are not ids 0..255"
    bad = 0
    for text, ids in zip(texts, want):
        got = []
        for chunk in split.findall(text):
            sym = [b2u[b] for b in chunk.encode()]
            while len(sym) > 1:
                best = min(range(len(sym) - 1), key=lambda i: (rank.get((sym[i], sym[i + 1]), 1 << 30), i))
                if (sym[best], sym[best + 1]) not in rank:
                    break
                sym[best:best + 2] = [sym[best] + sym[best + 1]]
            got += [vocab[s] for s in sym]
        if got != ids:
            print(f"  DIFFERENT for {text!r}: tokenizer.json {got} vs meshtrain {ids}")
            bad += 1
    print(f"  tokenizer.json run in Python: {len(texts) - bad}/{len(texts)} ASCII texts give meshtrain's ids "
          f"({len(vocab)} tokens, {len(rank)} merges)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
