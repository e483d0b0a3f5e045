#!/usr/bin/python3
"""Builds models/retrieval.gguf: a small Llama-architecture model that retrieves needles.

The weights are constructed by hand, not trained (ARCHITECTURE.md section 6 records why a
plain training recipe failed on 2 CPU cores). The model is the known two-layer induction
circuit (Olsson et al., "In-context Learning and Induction Heads", arXiv 2209.11895),
extended to match n-grams instead of single tokens:

  layer 0  five previous-token heads. Query and key are constant vectors in the fast RoPE
           pairs, chosen so that the rotary score peaks at relative offset k (k = 1..5) and is
           far lower at every other offset up to 131,072. Each head copies the token code of
           position n-k into its own residual subspace S_k.
  layer 1  induction heads (five identical query heads sharing one KV head, GQA). The query
           holds the codes of tokens n, n-1, ..., n-4 (S_0..S_4), the key holds the codes of
           tokens p-1, ..., p-5 (S_1..S_5), both in near-zero-frequency RoPE pairs, so the score
           counts how many of the last five tokens match the five tokens before p. The value
           copies token p's identity (code and copy-only word) into subspaces O and OX, which
           the unembedding turns into logits. A weak rotary recency term breaks exact ties
           towards the most recent match.
  FFNs     all zero (present because the architecture has them).

Token codes are +-e_i in 32 dimensions (64 "matchable" tokens: digits, capitals, a few
punctuation marks and template words; exactly orthogonal or opposite). The filler words are
"copy-only": the model can copy them but never matches on them. Every other token is generic:
it can be neither matched nor copied, and copying one yields EOS. Every residual subspace holds
exactly one unit vector, so RMSNorm divides by a known constant.

Usage: make_retrieval_model.py [-o models/retrieval.gguf] [--check [TOKENS ...]]
Deterministic: no randomness in the weights; reruns give a byte-identical file.
Needs only Python 3 and numpy (Debian's python3-numpy).
"""
import argparse
import math
import re
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- hyper-parameters
HEAD_DIM = 224
N_HEAD = 5            # query heads per layer
N_HEAD_KV = 1         # GQA: all five query heads share one KV head
N_LAYER = 2
N_FF = 32             # FFN width (weights are zero)
CTX = 131072          # llama.context_length
RMS_EPS = 1e-5
ROPE_BASE = float(np.float32(1e32))  # stored as f32: build with the value engines read back
WINDOW = 5            # tokens matched by the induction head (current + 4 previous)
CODE = 32             # code dimensions per subspace (64 matchable tokens as +-e_i)
SUB = CODE + 1        # + the generic-token flag
GAMMA = 1.0           # constant component of every embedding (the "bias" input)

N_FAST = 18           # RoPE pairs 0..17 (omega >= 1.4e-5) form the previous-token kernel
REC_PAIR = 18         # omega = 7.2e-6: recency tie-break in layer 1 (monotone up to ~218K)
CONTENT_PAIR0 = 32    # pairs 32..111 (omega <= 7e-10) carry the n-gram codes
KERNEL_RANGE = 131072 # offsets over which the previous-token kernel is optimised

L0_MARGIN = 40.0      # logits between offset k and the best other offset (layer 0)
MATCH = 300.0         # logits per matched token of the window (layer 1)
RECENCY = 200.0       # amplitude of the recency term (logits; < MATCH, see check_margins)
OUT_LOGIT = 20.0      # logit of the copied token (opposite code: -OUT_LOGIT, others 0)

N_COPY = 16           # copy-only words (filler): copied to the output, never matched
XSUB = N_COPY + 1     # + the "not a copy-only word" flag

# Residual stream layout: [C | S_0 | S_1 .. S_5 | X | O | OX]
#   S_k: match code of token n-k; X: copy-only identity of token n;
#   O, OX: the code and copy-only identity of the token layer 1 copied.
C_DIM = 0
def S(k):
    return 1 + SUB * k
X_DIM = S(WINDOW + 1)
O_DIM = X_DIM + XSUB
OX_DIM = O_DIM + SUB
D_MODEL = OX_DIM + XSUB   # 266

# ---------------------------------------------------------------- vocabulary
SP = "\u2581"  # SentencePiece's space marker
FILLER_WORDS = ["The", "There", "Here", "What", "Remember", "grass", "is", "green", "sky", "blue", "sun",
                "yellow", "we", "go", "and", "back", "again", "pass", "key", "it", "the", "value", "of"]
MATCHABLE_WORDS = ["The", "pass", "key", "is", "What", "the", "value", "of", "it", "Remember"]
MATCHABLE_PUNCT = [SP, ".", ":", "-", "?", ",", "=", "_"]
COPY_WORDS = [w for w in FILLER_WORDS if w not in MATCHABLE_WORDS]


def build_vocab():
    """Returns (tokens, scores, types). SPM merges two adjacent pieces only when their
    concatenation is in the vocabulary, so each word brings the chain of its prefixes, which builds
    it left to right; longer pieces score higher."""
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        toks.append("<0x%02X>" % b); scores.append(0.0); types.append(6)
    singles = [SP] + [chr(c) for c in range(33, 127)]
    for s in singles:
        toks.append(s); scores.append(-1.0); types.append(1)
    for d in "0123456789":
        toks.append(SP + d); scores.append(1.0); types.append(1)
    have = set(toks)
    for w in FILLER_WORDS:
        p = SP + w
        for n in range(2, len(p) + 1):
            piece = p[:n]
            if piece not in have:
                have.add(piece); toks.append(piece); scores.append(float(n)); types.append(1)
    return toks, scores, types


def matchable(toks):
    """Token id -> index 0..63 of its code for the 64 matchable tokens."""
    names = list("0123456789") + [SP + d for d in "0123456789"] + [chr(c) for c in range(65, 91)]
    names += MATCHABLE_PUNCT + [SP + w for w in MATCHABLE_WORDS]
    assert len(names) == 2 * CODE, len(names)
    idx = {t: i for i, t in enumerate(toks)}
    return {idx[n]: m for m, n in enumerate(names)}


def code_matrix(toks):
    """Returns (codes [n_vocab, SUB], xcodes [n_vocab, XSUB]). codes: +-e_(m//2) for matchable
    index m, the flag dimension for every other token. xcodes: one-hot for the copy-only words,
    the flag dimension for every other token. Each row of each is a unit vector."""
    codes = np.zeros((len(toks), SUB))
    xcodes = np.zeros((len(toks), XSUB))
    mt = matchable(toks)
    idx = {t: i for i, t in enumerate(toks)}
    copy = {idx[SP + w]: i for i, w in enumerate(COPY_WORDS)}
    assert len(copy) <= N_COPY
    for t in range(len(toks)):
        if t in mt:
            m = mt[t]
            codes[t, m // 2] = 1.0 if m % 2 == 0 else -1.0
        else:
            codes[t, CODE] = 1.0
        if t in copy:
            xcodes[t, copy[t]] = 1.0
        else:
            xcodes[t, N_COPY] = 1.0
    return codes, xcodes


class SpmTokenizer:
    """llama.cpp's SPM merge (highest-scoring adjacent pair first, leftmost on ties), with the
    space prefix and <0xXX> byte fallback; enough to build test prompts for this vocabulary."""

    def __init__(self, toks, scores):
        self.toks, self.scores = toks, scores
        self.index = {t: i for i, t in enumerate(toks)}
        self.cache = {}

    def encode(self, text, bos=True):
        out = [1] if bos else []
        s = SP + text.replace(" ", SP)
        # No piece of this vocabulary has SP after its first character, so merges never cross the
        # start of a word: each SP-led word is tokenized on its own (and cached).
        for word in re.findall(SP + "[^" + SP + "]*|[^" + SP + "]+", s):
            if word not in self.cache:
                self.cache[word] = self._encode_word(word)
            out.extend(self.cache[word])
        return out

    def _encode_word(self, s):
        sym = list(s)
        while True:
            best = None
            for i in range(len(sym) - 1):
                t = self.index.get(sym[i] + sym[i + 1])
                if t is not None and (best is None or self.scores[t] > best[0]):
                    best = (self.scores[t], i)
            if best is None:
                break
            i = best[1]
            sym[i:i + 2] = [sym[i] + sym[i + 1]]
        out = []
        for p in sym:
            if p in self.index:
                out.append(self.index[p])
            else:
                out.extend(self.index["<0x%02X>" % b] for b in p.encode())
        return out

    def decode(self, ids):
        return "".join(self.toks[i] for i in ids).replace(SP, " ")


# ---------------------------------------------------------------- RoPE and the offset kernel
def rope_omegas():
    i = np.arange(HEAD_DIM // 2, dtype=np.float64)
    return np.power(ROPE_BASE, -2.0 * i / HEAD_DIM)


def offset_kernel(omega):
    """Non-negative weights a (sum 1) over the fast pairs maximising
    min_{x=1..KERNEL_RANGE} sum_i a_i (1 - cos(x omega_i)): the score of sum_i a_i cos((dist-k) omega_i)
    at dist = k exceeds every other distance by that margin. Solved as a zero-sum game by
    fictitious play against a multiplicative-weights opponent (deterministic)."""
    x = np.arange(1, KERNEL_RANGE + 1, dtype=np.float64)
    G = 1.0 - np.cos(np.outer(omega[:N_FAST], x))
    logw = np.zeros(x.size)
    counts = np.zeros(N_FAST)
    for _ in range(3000):
        p = np.exp(-(logw - logw.min()))
        p /= p.sum()
        j = int(np.argmax(G @ p))
        counts[j] += 1
        logw += 0.5 * G[j]
    a = counts / counts.sum()
    return a, float((a @ G).min())


# ---------------------------------------------------------------- weights
def build_weights(toks):
    V, d, hd = len(toks), D_MODEL, HEAD_DIM
    codes, xcodes = code_matrix(toks)
    omega = rope_omegas()
    assert omega[CONTENT_PAIR0] <= 5e-6 and omega[N_FAST - 1] >= 1e-5
    a, rel_margin = offset_kernel(omega)
    sq = math.sqrt(hd)

    # RMSNorm multiplies by nu: every embedding is GAMMA*e_C + two unit vectors (S_0, X), layer 1's
    # input adds five more (S_1..S_5), the final norm's input two more (O, OX).
    nu0 = 1.0 / math.sqrt((GAMMA ** 2 + 2) / d + RMS_EPS)
    nu1 = 1.0 / math.sqrt((GAMMA ** 2 + 2 + WINDOW) / d + RMS_EPS)
    nu2 = 1.0 / math.sqrt((GAMMA ** 2 + 4 + WINDOW) / d + RMS_EPS)

    W = {}
    emb = np.zeros((V, d))
    emb[:, C_DIM] = GAMMA
    emb[:, S(0):S(0) + SUB] = codes
    emb[:, X_DIM:X_DIM + XSUB] = xcodes
    W["token_embd.weight"] = emb

    # ---- layer 0: previous-token heads
    amp = L0_MARGIN * sq / rel_margin  # q amplitude; keys have unit amplitude per pair
    wq = np.zeros((N_HEAD * hd, d)); wk = np.zeros((N_HEAD_KV * hd, d)); wv = np.zeros((N_HEAD_KV * hd, d))
    wo = np.zeros((d, N_HEAD * hd))
    for i in range(N_FAST):
        wk[2 * i, C_DIM] = 1.0 / (GAMMA * nu0)
    for h in range(N_HEAD):
        k = h + 1  # this head looks k tokens back
        for i in range(N_FAST):
            # q = a_i (cos k w, -sin k w) against key (1, 0): score a_i cos((dist - k) w_i)
            wq[h * hd + 2 * i, C_DIM] = amp * a[i] * math.cos(k * omega[i]) / (GAMMA * nu0)
            wq[h * hd + 2 * i + 1, C_DIM] = -amp * a[i] * math.sin(k * omega[i]) / (GAMMA * nu0)
        for j in range(SUB):
            wo[S(k) + j, h * hd + j] = 1.0
    for j in range(SUB):
        wv[j, S(0) + j] = 1.0 / nu0
    layer(W, 0, wq, wk, wv, wo)

    # ---- layer 1: n-gram induction heads
    wq = np.zeros((N_HEAD * hd, d)); wk = np.zeros((N_HEAD_KV * hd, d)); wv = np.zeros((N_HEAD_KV * hd, d))
    wo = np.zeros((d, N_HEAD * hd))
    for j in range(WINDOW):          # query: token n-j; key: token p-1-j
        for m in range(CODE):
            r = 2 * CONTENT_PAIR0 + CODE * j + m
            wk[r, S(j + 1) + m] = 1.0 / nu1
            for h in range(N_HEAD):
                wq[h * hd + r, S(j) + m] = MATCH * sq / nu1
    # Recency: key (1, 0), query (0, 1) in a slow pair gives -RECENCY sin(dist w), decreasing in dist.
    wk[2 * REC_PAIR, C_DIM] = 1.0 / (GAMMA * nu1)
    for h in range(N_HEAD):
        wq[h * hd + 2 * REC_PAIR + 1, C_DIM] = RECENCY * sq / (GAMMA * nu1)
        for j in range(SUB + XSUB):  # value dims: S_0 code, then X
            wo[O_DIM + j, h * hd + j] = 1.0 / N_HEAD
    for j in range(SUB):
        wv[j, S(0) + j] = 1.0 / nu1
    for j in range(XSUB):
        wv[SUB + j, X_DIM + j] = 1.0 / nu1
    layer(W, 1, wq, wk, wv, wo)

    W["output_norm.weight"] = np.ones(d)
    out = np.zeros((V, d))
    out[:, O_DIM:O_DIM + CODE] = OUT_LOGIT * codes[:, :CODE] / nu2
    out[:, OX_DIM:OX_DIM + N_COPY] = OUT_LOGIT * xcodes[:, :N_COPY] / nu2
    # A copied token that is neither matchable nor copy-only (both flags set) ends generation:
    # EOS scores OUT_LOGIT * (flag_O + flag_OX - 1.5), +OUT_LOGIT/2 with both flags, below zero otherwise.
    out[2, O_DIM + CODE] = OUT_LOGIT / nu2
    out[2, OX_DIM + N_COPY] = OUT_LOGIT / nu2
    out[2, C_DIM] = -1.5 * OUT_LOGIT / (GAMMA * nu2)
    W["output.weight"] = out
    info = dict(kernel=a, kernel_margin=rel_margin, omega=omega, amp=amp)
    return W, info


def layer(W, l, wq, wk, wv, wo):
    p = "blk.%d." % l
    d = D_MODEL
    W[p + "attn_norm.weight"] = np.ones(d)
    W[p + "attn_q.weight"] = wq
    W[p + "attn_k.weight"] = wk
    W[p + "attn_v.weight"] = wv
    W[p + "attn_output.weight"] = wo
    W[p + "ffn_norm.weight"] = np.ones(d)
    W[p + "ffn_gate.weight"] = np.zeros((N_FF, d))
    W[p + "ffn_up.weight"] = np.zeros((N_FF, d))
    W[p + "ffn_down.weight"] = np.zeros((d, N_FF))


def check_margins(info):
    """Worst-case logit gaps of the construction, evaluated over offsets up to CTX."""
    om = info["omega"]
    dist = np.arange(0, CTX + 1, dtype=np.float64)
    rec = -RECENCY * np.sin(dist * om[REC_PAIR])
    drift = 1.0 - np.cos(dist[-1] * om[CONTENT_PAIR0])
    cross = math.sin(dist[-1] * om[CONTENT_PAIR0])
    # An exact match at the far end against a one-token-short match next to the query.
    exact_far = WINDOW * MATCH * (1 - drift) + rec[-1]
    near_partial = (WINDOW - 1) * MATCH + MATCH * cross
    return dict(layer0_margin=L0_MARGIN, exact_vs_partial=exact_far - near_partial,
                recency_range=-rec[-1], tie_break_per_100=RECENCY * math.sin(100 * om[REC_PAIR]))


# ---------------------------------------------------------------- reference forward pass (numpy)
def reference_logits(W, tokens, f16_cache=True):
    """The llama forward pass as the engine computes it (f64 here, keys/values rounded to f16
    like the engine's default cache). Returns logits [n_tokens, n_vocab]."""
    T, hd = len(tokens), HEAD_DIM
    om = rope_omegas()
    ang = np.outer(np.arange(T), om)
    cs, sn = np.cos(ang), np.sin(ang)

    def rope(x):  # x [T, heads, hd]; pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = x0 * cs[:, None, :] - x1 * sn[:, None, :]
        y[..., 1::2] = x0 * sn[:, None, :] + x1 * cs[:, None, :]
        return y

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS) * w

    x = W["token_embd.weight"][tokens].copy()
    mask = np.triu(np.full((T, T), -np.inf), 1)
    G = N_HEAD // N_HEAD_KV
    for l in range(N_LAYER):
        p = "blk.%d." % l
        xn = norm(x, W[p + "attn_norm.weight"])
        q = rope((xn @ W[p + "attn_q.weight"].T).reshape(T, N_HEAD, hd))
        k = rope((xn @ W[p + "attn_k.weight"].T).reshape(T, N_HEAD_KV, hd))
        v = (xn @ W[p + "attn_v.weight"].T).reshape(T, N_HEAD_KV, hd)
        if f16_cache:
            k = k.astype(np.float16).astype(np.float64)
            v = v.astype(np.float16).astype(np.float64)
        att = np.empty((T, N_HEAD, hd))
        for h in range(N_HEAD):
            s = q[:, h] @ k[:, h // G].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:, h // G]
        x = x + att.reshape(T, -1) @ W[p + "attn_output.weight"].T
        xn = norm(x, W[p + "ffn_norm.weight"])
        g = xn @ W[p + "ffn_gate.weight"].T
        u = xn @ W[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
    return norm(x, W["output_norm.weight"]) @ W["output.weight"].T


# ---------------------------------------------------------------- task prompts (documented in RETRIEVAL.md)
FILLER = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again."]


def haystack(tok, n_tokens, needles, depths):
    """Filler sentences totalling about n_tokens tokens with each needle inserted between sentences
    at its depth (fraction 0..1 of the filler)."""
    per = sum(len(tok.encode(s, bos=False)) for s in FILLER) / len(FILLER)
    n_sent = max(1, int(n_tokens / per))
    sents = [FILLER[i % len(FILLER)] for i in range(n_sent)]
    for needle, depth in sorted(zip(needles, depths), key=lambda t: -t[1]):
        sents.insert(int(round(depth * n_sent)), needle)
    return " ".join(sents)


def passkey_prompt(tok, n_tokens, depth, key):
    ctx = haystack(tok, n_tokens, ["The pass key is %s. Remember it. %s is the pass key." % (key, key)], [depth])
    return ctx + " What is the pass key? The pass key is", " " + key


def kv_prompt(tok, n_tokens, pairs, depths, ask):
    needles = ["The value of key-%s is %s." % kv for kv in pairs]
    ctx = haystack(tok, n_tokens, needles, depths)
    key, value = pairs[ask]
    return ctx + " What is the value of key-%s? The value of key-%s is" % (key, key), " " + value


def teacher_forced_correct(W, tok, prompt, answer):
    """True when greedy decoding would produce `answer` (every answer token is the argmax)."""
    p = tok.encode(prompt)
    a = tok.encode(prompt + answer)[len(p):]
    assert tok.encode(prompt + answer)[:len(p)] == p
    logits = reference_logits(W, p + a[:-1])
    pred = logits[len(p) - 1:].argmax(-1)
    return bool((pred == np.array(a)).all())


def self_check(W, tok, lengths=(256, 1024, 2048), n=6, seed=1234):
    rng = np.random.default_rng(seed)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    for L in lengths:
        ok = tot = 0
        for i in range(n):
            depth = i / max(1, n - 1)
            key = "".join(rng.choice(list("0123456789"), 5))
            ok += teacher_forced_correct(W, tok, *passkey_prompt(tok, L, depth, key))
            tot += 1
            pairs = [("".join(rng.choice(list(letters), 3)), "".join(rng.choice(list("0123456789"), 7)))
                     for _ in range(4)]
            ok += teacher_forced_correct(W, tok, *kv_prompt(tok, L, pairs, rng.random(4), int(rng.integers(4))))
            tot += 1
        print("reference forward, %5d tokens: %d/%d correct" % (L, ok, tot))


# ---------------------------------------------------------------- GGUF writer (v3, little-endian)
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR = 4, 5, 6, 7, 8, 9
ALIGN = 32


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value, atype=None):
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == GGUF_ARR:
        out += struct.pack("<IQ", atype, len(value))
        for v in value:
            out += gguf_scalar(atype, v)
    else:
        out += gguf_scalar(vtype, value)
    return out


def gguf_scalar(t, v):
    if t == GGUF_U32: return struct.pack("<I", v)
    if t == GGUF_I32: return struct.pack("<i", v)
    if t == GGUF_F32: return struct.pack("<f", v)
    if t == GGUF_BOOL: return struct.pack("<B", 1 if v else 0)
    if t == GGUF_STR: return gguf_str(v)
    raise ValueError(t)


def write_gguf(path, W, toks, scores, types):
    kvs = [
        gguf_kv("general.architecture", GGUF_STR, "llama"),
        gguf_kv("general.name", GGUF_STR, "kvslim-retrieval"),
        gguf_kv("general.alignment", GGUF_U32, ALIGN),
        gguf_kv("llama.context_length", GGUF_U32, CTX),
        gguf_kv("llama.embedding_length", GGUF_U32, D_MODEL),
        gguf_kv("llama.block_count", GGUF_U32, N_LAYER),
        gguf_kv("llama.feed_forward_length", GGUF_U32, N_FF),
        gguf_kv("llama.attention.head_count", GGUF_U32, N_HEAD),
        gguf_kv("llama.attention.head_count_kv", GGUF_U32, N_HEAD_KV),
        gguf_kv("llama.attention.key_length", GGUF_U32, HEAD_DIM),
        gguf_kv("llama.attention.value_length", GGUF_U32, HEAD_DIM),
        gguf_kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, RMS_EPS),
        gguf_kv("llama.rope.freq_base", GGUF_F32, ROPE_BASE),
        gguf_kv("llama.rope.dimension_count", GGUF_U32, HEAD_DIM),
        gguf_kv("llama.vocab_size", GGUF_U32, len(toks)),
        gguf_kv("tokenizer.ggml.model", GGUF_STR, "llama"),
        gguf_kv("tokenizer.ggml.tokens", GGUF_ARR, toks, GGUF_STR),
        gguf_kv("tokenizer.ggml.scores", GGUF_ARR, scores, GGUF_F32),
        gguf_kv("tokenizer.ggml.token_type", GGUF_ARR, types, GGUF_I32),
        gguf_kv("tokenizer.ggml.bos_token_id", GGUF_U32, 1),
        gguf_kv("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
        gguf_kv("tokenizer.ggml.unknown_token_id", GGUF_U32, 0),
        gguf_kv("tokenizer.ggml.add_bos_token", GGUF_BOOL, True),
        gguf_kv("tokenizer.ggml.add_eos_token", GGUF_BOOL, False),
        gguf_kv("tokenizer.ggml.add_space_prefix", GGUF_BOOL, True),
    ]
    names = list(W)
    infos, blobs, off = [], [], 0
    for name in names:
        arr = np.ascontiguousarray(W[name], dtype="<f4")
        ne = list(reversed(arr.shape))  # ggml order: ne[0] is the innermost (input) dimension
        infos.append(gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
                     + struct.pack("<IQ", 0, off))  # type 0 = F32
        blob = arr.tobytes()
        pad = (-len(blob)) % ALIGN
        blobs.append(blob + b"\0" * pad)
        off += len(blob) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(names), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default="models/retrieval.gguf")
    ap.add_argument("--check", type=int, nargs="*", metavar="TOKENS",
                    help="also run the numpy reference on sample prompts of these lengths (default 256 1024 2048)")
    args = ap.parse_args()
    toks, scores, types = build_vocab()
    W, info = build_weights(toks)
    m = check_margins(info)
    print("vocab %d, d_model %d, head_dim %d, %d heads / %d KV heads, %d layers" %
          (len(toks), D_MODEL, HEAD_DIM, N_HEAD, N_HEAD_KV, N_LAYER))
    print("previous-token kernel: relative margin %.4f, weights %s" %
          (info["kernel_margin"], np.array2string(info["kernel"], precision=3)))
    print("margins (logits): " + ", ".join("%s %.1f" % kv for kv in m.items()))
    if m["exact_vs_partial"] < 20:
        sys.exit("construction margins too small")
    write_gguf(args.output, W, toks, scores, types)
    n_par = sum(w.size for w in W.values())
    print("wrote %s (%d parameters)" % (args.output, n_par))
    if args.check is not None:
        self_check(W, SpmTokenizer(toks, scores), tuple(args.check) or (256, 1024, 2048))


if __name__ == "__main__":
    main()
