#!/usr/bin/python3
"""Measures models/retrieval.gguf through the engine: `kvslim generate --temp 0` on seeded passkey
and key-value prompts (the formats of models/RETRIEVAL.md) over a length x depth grid, with an
optional press. Prints accuracy per length and task, and per depth.

Usage: measure.py --kvslim build/kvslim [--lengths 256 1024 2048] [--depths 11] [--press streaming_llm
       --ratio 0.9] [--keys 4] [--seed 7]
The context (haystack with needles) is compressed by the press; the question is appended after
compression, as in `kvslim generate --question`.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_retrieval_model as mrm  # noqa: E402


def run(kvslim, model, context, question, press, ratio, n_predict, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(context)
        path = f.name
    try:
        cmd = [kvslim, "generate", "-m", model, "-f", path, "--question", question, "--temp", "0",
               "-n", str(n_predict), "-t", str(threads), "--no-display-prompt"]
        if press != "none":  # the CLI refuses a ratio without a press
            cmd += ["--press", press, "--compression-ratio", str(ratio)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    # stdout: the generated text and a newline (statistics go to stderr)
    assert out.endswith("\n"), "unexpected CLI output"
    return out[:-1]


def split(prompt, marker):
    i = prompt.rindex(marker)
    return prompt[:i], prompt[i:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvslim", required=True)
    ap.add_argument("-m", "--model", default="models/retrieval.gguf")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--depths", type=int, default=11, help="needle depths 0, 1/(n-1), ..., 1")
    ap.add_argument("--press", default="none")
    ap.add_argument("--ratio", type=float, default=0.0)
    ap.add_argument("--keys", type=int, default=4, help="key-value pairs per key-value prompt")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    toks, scores, _ = mrm.build_vocab()
    tok = mrm.SpmTokenizer(toks, scores)
    rng = np.random.default_rng(args.seed)
    keychars = list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    digits = list("0123456789")
    depth_ok = np.zeros((2, args.depths)); depth_n = np.zeros((2, args.depths))
    print("press %s, ratio %g" % (args.press, args.ratio))
    for L in args.lengths:
        ok = [0, 0]
        for i in range(args.depths):
            depth = i / max(1, args.depths - 1)
            key = "".join(rng.choice(digits, 5))
            prompt, answer = mrm.passkey_prompt(tok, L, depth, key)
            ctx, q = split(prompt, " What is the pass key?")
            got = run(args.kvslim, args.model, ctx, q, args.press, args.ratio, 8, args.threads)
            hit = got.startswith(answer)
            ok[0] += hit; depth_ok[0, i] += hit; depth_n[0, i] += 1
            if not hit:
                print("  miss passkey L=%d depth=%.2f: want %r got %r" % (L, depth, answer, got))
            keys = set()
            while len(keys) < args.keys:
                keys.add("".join(rng.choice(keychars, 3)))
            pairs = [(k, "".join(rng.choice(digits, 7))) for k in sorted(keys)]
            depths = list(rng.random(args.keys))
            ask = int(rng.integers(args.keys))
            depths[ask] = depth
            prompt, answer = mrm.kv_prompt(tok, L, pairs, depths, ask)
            ctx, q = split(prompt, " What is the value of key-")
            got = run(args.kvslim, args.model, ctx, q, args.press, args.ratio, 10, args.threads)
            hit = got.startswith(answer)
            ok[1] += hit; depth_ok[1, i] += hit; depth_n[1, i] += 1
            if not hit:
                print("  miss kv L=%d depth=%.2f: want %r got %r" % (L, depth, answer, got))
        n_tok = len(tok.encode(prompt))
        print("length %5d (%5d tokens with question): passkey %d/%d, key-value (%d pairs) %d/%d"
              % (L, n_tok, ok[0], args.depths, args.keys, ok[1], args.depths))
        sys.stdout.flush()
    print("by depth (passkey, key-value): " + " ".join(
        "%.1f:%d/%d,%d/%d" % (i / max(1, args.depths - 1), depth_ok[0, i], depth_n[0, i], depth_ok[1, i], depth_n[1, i])
        for i in range(args.depths)))


if __name__ == "__main__":
    main()
