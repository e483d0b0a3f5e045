#!/usr/bin/python3
"""Independent float64 reference forward pass for llama/qwen2 GGUF files with f32 weights.

Used by the test suite to check the engine's forward pass on architectures and options for which
no llama.cpp reference output is bundled (qwen2 biases and NEOX RoPE, Llama-3 rope_freqs,
tied embeddings, GQA). Written from the model definitions, not from the engine's code.

usage: ref_forward.py MODEL.gguf TOKEN [TOKEN ...]  -> prints one line of logits per token
"""
import struct
import sys

import numpy as np


def read_gguf(path):
    data = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        vals = struct.unpack_from("<" + fmt, data, off)
        off += struct.calcsize("<" + fmt)
        return vals[0] if len(vals) == 1 else vals

    def string():
        n = take("Q")
        nonlocal off
        s = data[off:off + n].decode("utf-8", "replace")
        off += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t in scalar:
            return take(scalar[t])
        if t == 8:
            return string()
        if t == 9:
            et = take("I")
            n = take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError("bad type %d" % t)

    assert take("I") == 0x46554747
    take("I")
    n_t, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("I")
        ne = [take("q") for _ in range(nd)]
        ty = take("I")
        o = take("Q")
        infos.append((name, ne, ty, o))
    align = meta.get("general.alignment", 32)
    start = (off + align - 1) // align * align
    tensors = {}
    for name, ne, ty, o in infos:
        assert ty == 0, "only f32 tensors are supported by the reference (%s)" % name
        n = int(np.prod(ne))
        arr = np.frombuffer(data, dtype="<f4", count=n, offset=start + o).astype(np.float64)
        tensors[name] = arr.reshape(list(reversed(ne)))  # numpy order: rows = ne[1]
    return meta, tensors


def forward(meta, t, tokens):
    arch = meta["general.architecture"]
    g = lambda k, d=None: meta.get(arch + "." + k, d)
    n_embd, n_layer = g("embedding_length"), g("block_count")
    n_head = g("attention.head_count")
    n_kv = g("attention.head_count_kv", n_head)
    hd = g("attention.key_length", n_embd // n_head)
    eps = g("attention.layer_norm_rms_epsilon", 1e-5)
    base = g("rope.freq_base", 10000.0)
    scale = 1.0
    if g("rope.scaling.type") == "linear":
        scale = 1.0 / g("rope.scaling.factor")
    neox = arch == "qwen2"
    freqs = base ** (-np.arange(0, hd, 2) / hd) * scale
    if "rope_freqs.weight" in t:
        freqs = freqs / t["rope_freqs.weight"]
    n = len(tokens)
    pos = np.arange(n)
    ang = pos[:, None] * freqs[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # x: [n, heads, hd]
        if neox:
            a, b = x[..., : hd // 2], x[..., hd // 2:]
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        ra, rb = a * c - b * s, a * s + b * c
        out = np.empty_like(x)
        if neox:
            out[..., : hd // 2], out[..., hd // 2:] = ra, rb
        else:
            out[..., 0::2], out[..., 1::2] = ra, rb
        return out

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    x = t["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(n_layer):
        p = "blk.%d." % l
        h = norm(x, t[p + "attn_norm.weight"])
        q = h @ t[p + "attn_q.weight"].T
        k = h @ t[p + "attn_k.weight"].T
        v = h @ t[p + "attn_v.weight"].T
        if p + "attn_q.bias" in t:
            q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
        q = rope(q.reshape(n, n_head, hd))
        k = rope(k.reshape(n, n_kv, hd))
        v = v.reshape(n, n_kv, hd)
        grp = n_head // n_kv
        out = np.empty((n, n_head, hd))
        for qh in range(n_head):
            s = q[:, qh, :] @ k[:, qh // grp, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, qh, :] = s @ v[:, qh // grp, :]
        x = x + out.reshape(n, n_head * hd) @ t[p + "attn_output.weight"].T
        h = norm(x, t[p + "ffn_norm.weight"])
        gt = h @ t[p + "ffn_gate.weight"].T
        up = h @ t[p + "ffn_up.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ t[p + "ffn_down.weight"].T
    out_w = t.get("output.weight", t["token_embd.weight"])
    return norm(x, t["output_norm.weight"]) @ out_w.T


def main():
    meta, tensors = read_gguf(sys.argv[1])
    tokens = [int(a) for a in sys.argv[2:]]
    for row in forward(meta, tensors, tokens):
        print(" ".join("%.9g" % v for v in row))


if __name__ == "__main__":
    main()
