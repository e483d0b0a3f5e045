#!/usr/bin/env python3
"""Writes the committed seed corpus in fuzz/corpus/<target>/ (run from the repository root).

gguf: two bundled vocabulary-only GGUF files (SPM and BPE) and a small hand-made GGUF v3 holding
every value type, a nested array and two tensors. tokenizer: lines of the bundled tokenizer test
inputs, each prefixed with the selector byte of fuzz_tokenizer.cpp. press_spec: specs from the
README and docs. task_text: the bundled task text and small variants. server_request: request
bodies for both endpoints, each after fuzz_server_request.cpp's selector byte.
"""
import base64
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def small_gguf():
    """GGUF v3: one key of each scalar type, a string array, a nested array, an f32 and a q8_0 tensor."""
    kv = []
    kv.append(gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama"))
    kv.append(gguf_string("u8") + struct.pack("<IB", 0, 7))
    kv.append(gguf_string("i8") + struct.pack("<Ib", 1, -7))
    kv.append(gguf_string("u16") + struct.pack("<IH", 2, 700))
    kv.append(gguf_string("i16") + struct.pack("<Ih", 3, -700))
    kv.append(gguf_string("llama.block_count") + struct.pack("<II", 4, 1))
    kv.append(gguf_string("i32") + struct.pack("<Ii", 5, -70000))
    kv.append(gguf_string("llama.rope.freq_base") + struct.pack("<If", 6, 10000.0))
    kv.append(gguf_string("flag") + struct.pack("<IB", 7, 1))
    kv.append(gguf_string("u64") + struct.pack("<IQ", 10, 1 << 40))
    kv.append(gguf_string("i64") + struct.pack("<Iq", 11, -(1 << 40)))
    kv.append(gguf_string("f64") + struct.pack("<Id", 12, 0.5))
    toks = ["<unk>", "<s>", "</s>", "\u2581a", "b", "\u2581ab"]
    kv.append(gguf_string("tokenizer.ggml.model") + struct.pack("<I", 8) + gguf_string("llama"))
    kv.append(gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(toks))
              + b"".join(gguf_string(t) for t in toks))
    kv.append(gguf_string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, len(toks))
              + b"".join(struct.pack("<f", -i) for i in range(len(toks))))
    kv.append(gguf_string("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, len(toks))
              + struct.pack("<6i", 2, 3, 3, 1, 1, 1))
    kv.append(gguf_string("nested") + struct.pack("<IIQ", 9, 9, 2)
              + struct.pack("<IQ", 4, 2) + struct.pack("<2I", 1, 2)
              + struct.pack("<IQ", 4, 1) + struct.pack("<I", 3))
    tensors = [("t.f32", 0, [4, 2], struct.pack("<8f", *range(8))),
               ("t.q8_0", 8, [32, 1], struct.pack("<e", 0.5) + bytes(range(32)))]
    infos, data, off = b"", b"", 0
    for name, ty, ne, raw in tensors:
        infos += gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", ty, off)
        pad = (-len(raw)) % 32
        data += raw + bytes(pad)
        off += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + infos
    head += bytes((-len(head)) % 32)
    return head + data


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    vocab = os.path.join(ROOT, "tests", "data", "vocab")
    for name in ("ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"):
        with open(os.path.join(vocab, name), "rb") as f:
            write("gguf", name, f.read())
    write("gguf", "small-v3.gguf", small_gguf())

    with open(os.path.join(vocab, "ggml-vocab-llama-spm.gguf.inp"), encoding="utf-8") as f:
        cases = [c.strip("\n") for c in f.read().split("\n__ggml_vocab_test__\n") if c.strip()]
    for i, text in enumerate(cases[:24]):
        # selector byte: tokenizer i % 4, special parsing on every other one, BOS on some
        write("tokenizer", f"case{i:02d}", bytes([(i % 4) + 4 * (i // 4 % 2) + 16 * (i % 3 == 0)]) + text.encode())

    specs = ["snapkv", "snapkv:window=32,kernel=5,pooling=max", "adakv(snapkv:window=32,alpha=0.3)",
             "adakv(snapkv:window=32):alpha=0.3,ratio=0.25", "threshold(knorm,window=64,tau=0)",
             "snapkv:ratio=0.2+knorm", "key_rerotation(adakv(snapkv))", "decoding(knorm:ratio=0.5):interval=16",
             "leankv(criticalkv(snapkv):epsilon=0.001,first_stage=0.4)", "per_layer(knorm):ratios=0.5/0.25",
             "pyramidkv:beta=20", "streaming_llm:sink=4", "SnapKVPress", "chunkkv(knorm):chunk=8",
             "threshold:tau=1e+5", "clusterkv:full_layers=0,sink=4", "think:key_ratio=0.5", "h2o+tova"]
    for i, s in enumerate(specs):
        write("press_spec", f"spec{i:02d}", s)

    with open(os.path.join(ROOT, "models", "retrieval.tasks.json"), "rb") as f:
        write("task_text", "retrieval.tasks.json", f.read())
    write("task_text", "small.json", '{"filler": ["a.", "b."], "separator": " ", "key_length": 4, "_c": 1}')
    write("task_text", "keys.json", '{"keys": ["x-y", "z-w"], "value_digits": 5, "words": ["one", "two"]}')
    # server_request: selector byte (bit 0 chat, bits 1-2 the vocabulary size) + request body.
    requests = [
        (4, '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stop":["\\n","The"],"stream":true,'
            '"stream_options":{"include_usage":true},"press":"snapkv","compression_ratio":0.5,"seed":7}'),
        (4, '{"prompt":[1,400,300,4294967301],"max_tokens":2}'),
        (6, '{"prompt":[1,9223372036854775808,-3],"top_k":40,"top_p":0.9,"question":"Who?"}'),
        (5, '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text",'
            '"text":"Hi"}]}],"max_completion_tokens":4,"cache_type_k":"q8_0"}'),
        (1, '{"messages":[{"role":"developer","content":"x"},{"role":"assistant","content":null}],"tools":[{}]}'),
    ]
    for i, (sel, body) in enumerate(requests):
        write("server_request", f"request{i:02d}", bytes([sel]) + body.encode())
    # Findings, kept as seeds (each has a regression test in tests/).
    write("task_text", "regression-number-overflow.json",  # tests/press/test_input_limits.cpp TaskTextJson
          base64.b64decode("eyJrZXlfa2V5cyI6IFs2Njg4NjY2ODhlODg4ODguODg2NjY4OGV5X2s2Njb/DQAbAGEAAAB0cw=="))


if __name__ == "__main__":
    main()
