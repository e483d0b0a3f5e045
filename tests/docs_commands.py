#!/usr/bin/env python3
"""Runs every kvslim command written in the README and the docs, as written but at small sizes.

A command in a fenced or indented code block of README.md, docs/**/*.md or models/*.md that
starts with `kvslim`, `build/kvslim`, `./build/kvslim` or `mpirun ... kvslim` is run from a
scratch directory that links the repository's models/, tools/ and build/ (so relative paths
resolve as in a checkout and outputs land in the scratch directory). Sizes are cut so the
whole check takes seconds: one sample, the smallest length (at most 2,048 tokens), the first
depth/ratio/task, at most two presses, short fidelity texts, a few generated tokens. A command
passes when it exits 0 and, for a task sweep, its full cache did not score 0 (the bug this check exists for: commands that
ran on the story model without -m and scored 0 silently).

Synopses (placeholders such as MODEL or FILE, alternatives with |, optional [parts]) and
commands that need files the repository does not have are listed as skipped, with the reason.
Exit status 1 when a command fails; --list only prints what would run.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]{1,}(\.[a-z]+)?(,[A-Z0-9_]+)*$")
STARTS = ("kvslim ", "build/kvslim ", "./build/kvslim ", "mpirun ")
# Longest eval context run: a sweep documented only at 131,072 tokens runs here at this length.
MAX_LENGTH = 2048


def code_lines(text):
    """Lines of fenced blocks and of 4-space indented blocks (outside lists), continuations joined."""
    out, fenced, prev_blank = [], False, True
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            prev_blank = False
            continue
        if fenced:
            out.append(raw.strip())
        elif raw.startswith("    ") and (prev_blank or (out and out[-1].endswith("\\"))):
            out.append(raw.strip())
            prev_blank = True  # an indented block continues until a non-indented line
            continue
        prev_blank = raw.strip() == ""
    joined, cur = [], ""
    for line in out:
        if cur:
            cur += " " + line
        else:
            cur = line
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        joined.append(cur)
        cur = ""
    if cur:
        joined.append(cur)
    return joined


def commands(root):
    files = ["README.md"]
    for d in ("docs", "models"):
        for base, _, names in os.walk(os.path.join(root, d)):
            files += [os.path.relpath(os.path.join(base, n), root) for n in sorted(names) if n.endswith(".md")]
    for f in files:
        path = os.path.join(root, f)
        if not os.path.exists(path):
            continue
        for whole in code_lines(open(path, encoding="utf-8").read()):
            if " #" in whole and "'" not in whole and '"' not in whole:
                whole = whole.split(" #")[0].strip()
            # A chain (install && build && run) contributes its kvslim part.
            for line in (part.strip() for part in whole.split("&&")):
                if line.startswith(STARTS) and ("kvslim" in line.split()[0] or " kvslim " in line or "/kvslim " in line):
                    yield f, line


def python_blocks(text):
    """The ```python blocks of a document, in order (a notebook: later cells use earlier names)."""
    blocks, cur = [], None
    for raw in text.splitlines():
        stripped = raw.strip()
        if cur is None and stripped.startswith("```python"):
            cur = []
        elif cur is not None and stripped.startswith("```"):
            blocks.append("\n".join(cur))
            cur = None
        elif cur is not None:
            cur.append(raw)
    return blocks


def synopsis(tokens):
    for t in tokens:
        if "|" in t or t.startswith("[") or t.endswith("]") or "..." in t or PLACEHOLDER.match(t):
            return t
    return None


def value_after(tokens, i):
    return tokens[i + 1] if i + 1 < len(tokens) else None


def shrink(tokens):
    """Cuts the sizes of a kvslim command; returns the new token list."""
    out, i = [], 0
    single = {"--samples": "1", "-r": "1", "--repetitions": "1", "--reps": "1", "--gen": "2"}
    first = {"--depths", "--ratios", "--tasks"}
    while i < len(tokens):
        t = tokens[i]
        v = value_after(tokens, i)
        if t in first | {"--lengths"} and v is not None:
            # list options take "a,b" or "a b": gather every value up to the next flag
            j, vals = i + 1, []
            while j < len(tokens) and not tokens[j].startswith("-"):
                vals += tokens[j].split(",")
                j += 1
            keep = vals[0] if t in first else str(min(min(int(x) for x in vals), MAX_LENGTH))
            out += [t, keep]
            i = j
        elif t in single and v is not None:
            out += [t, single[t]]
            i += 2
        elif t in first and v is not None:
            out += [t, v.split(",")[0]]
            i += 2
        elif t == "--lengths" and v is not None:
            out += [t, str(min(min(int(x) for x in v.split(",")), MAX_LENGTH))]
            i += 2
        elif t in ("--context-tokens",) and v is not None:
            out += [t, str(min(int(v), 64))]
            i += 2
        elif t in ("--continuation-tokens",) and v is not None:
            out += [t, str(min(int(v), 16))]
            i += 2
        elif t in ("-n", "--n-predict") and v is not None and "eval" not in tokens and "bench" not in tokens:
            out += [t, str(min(int(v), 8)) if int(v) >= 0 else "8"]
            i += 2
        elif t == "--press" and "eval" in tokens:
            # keep the first two specs of a space-separated list
            j, specs = i + 1, []
            while j < len(tokens) and not tokens[j].startswith("-"):
                specs.append(tokens[j])
                j += 1
            out += [t] + specs[:2]
            i = j
        elif t in ("-p", "--n-prompt") and "bench" in tokens and v is not None:
            out += [t, "16"]
            i += 2
        elif t in ("--depth", "-d") and "bench" in tokens and v is not None:
            out += [t, "32"]
            i += 2
        elif t in ("-n", "--n-gen") and "bench" in tokens and v is not None:
            out += [t, "2"]  # bench takes lists (-n 16,32): one short decode test
            i += 2
        else:
            out.append(t)
            i += 1
    # bench repeats each test 5 times by default (llama-bench's -r): once is enough here.
    if "bench" in tokens and not any(t in ("-r", "--repetitions") for t in out):
        out += ["-r", "1"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvslim", required=True, help="the built kvslim binary")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="where README.md, docs/ and models/*.md are read (default: this repository)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--python-path", default="",
                    help="PYTHONPATH holding the kvslim package: also run the ```python blocks of the docs")
    a = ap.parse_args()
    kvslim = os.path.abspath(a.kvslim)
    scratch = tempfile.mkdtemp(prefix="kvslim_docs_")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in ("models", "tools", "tests"):
        os.symlink(os.path.join(repo, d), os.path.join(scratch, d))
    os.makedirs(os.path.join(scratch, "build"))
    os.symlink(kvslim, os.path.join(scratch, "build", "kvslim"))
    failed, ran, skipped = [], 0, []
    for f, line in commands(a.root):
        try:
            tokens = shlex.split(line)
        except ValueError as e:
            failed.append((f, line, f"cannot split: {e}"))
            continue
        why = synopsis(tokens)
        if why:
            skipped.append((f, line, f"synopsis ({why})"))
            continue
        missing = [t for t in tokens if ("/" in t or t.endswith((".gguf", ".txt", ".json")))
                   and not t.startswith(("-", "eval-out")) and os.path.basename(t) != "kvslim"
                   and not re.fullmatch(r"\d+/\d+", t)
                   and not os.path.exists(os.path.join(scratch, t)) and not os.path.exists(t)]
        outputs = {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in ("-o", "--out", "--json")}
        missing = [m for m in missing if m not in outputs]
        if missing:
            skipped.append((f, line, f"needs {', '.join(missing)}"))
            continue
        if tokens[0] == "mpirun":
            if not shutil_which("mpirun"):
                skipped.append((f, line, "mpirun not installed"))
                continue
            k = next(i for i, t in enumerate(tokens) if t.endswith("kvslim"))
            pre = ["mpirun", "-n", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            tokens = pre + [kvslim] + shrink(tokens[k + 1:])
        else:
            tokens = [kvslim] + shrink(tokens[1:])
        if "eval" in tokens and "merge" not in tokens:
            # Defaults of a sweep are sized for a real run: cut them too.
            for flag, small in (("--no-progress", None), ("--samples", "1"), ("--ratios", "0.5")):
                if flag not in tokens:
                    tokens += [flag] + ([small] if small else [])
            if "niah" in tokens and "--depths" not in tokens:
                tokens += ["--depths", "0.5"]
        if a.list:
            print(f"{f}: {' '.join(shlex.quote(t) for t in tokens)}")
            continue
        ran += 1
        if len(tokens) > 1 and tokens[1] == "serve":
            why = try_serve(tokens, scratch)
            if why:
                failed.append((f, line, why))
            continue
        r = subprocess.run(tokens, cwd=scratch, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            failed.append((f, line, f"exit {r.returncode}: {r.stderr.strip()[-400:]}"))
        elif "THE FULL CACHE SCORED 0" in r.stderr:
            failed.append((f, line, "the full cache scored 0 (wrong model or task text for the task)"))
    if a.python_path and not a.list:
        for base, _, names in os.walk(os.path.join(a.root, "docs")):
            for n in sorted(names):
                if not n.endswith(".md"):
                    continue
                f = os.path.relpath(os.path.join(base, n), a.root)
                code = "\n\n".join(python_blocks(open(os.path.join(base, n), encoding="utf-8").read()))
                if not code:
                    continue
                ran += 1
                env = dict(os.environ, PYTHONPATH=a.python_path)
                r = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env, capture_output=True, text=True,
                                   timeout=300)
                if r.returncode != 0:
                    failed.append((f, "python blocks", f"exit {r.returncode}: {r.stderr.strip()[-600:]}"))
    for f, line, why in skipped:
        print(f"skipped  {f}: {line[:100]}  -- {why}")
    for f, line, why in failed:
        print(f"FAILED   {f}: {line}\n         {why}")
    print(f"{ran} commands ran, {len(failed)} failed, {len(skipped)} skipped")
    subprocess.run(["rm", "-rf", scratch])
    return 1 if failed else 0


def try_serve(tokens, cwd):
    """A `kvslim serve` line: started on a free port (its --port replaced by 0), then asked for
    /health and one completion over HTTP, then stopped with SIGTERM. Returns why it failed, or ''."""
    import http.client
    import json
    tokens = [t for t in tokens if t != "&"]
    if "--port" in tokens:
        tokens[tokens.index("--port") + 1] = "0"
    else:
        tokens += ["--port", "0"]
    proc = subprocess.Popen(tokens, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        port, log = None, []
        deadline = time.time() + 120
        while time.time() < deadline and port is None:
            line = proc.stderr.readline()
            if not line:
                break
            log.append(line)
            m = re.search(r"on http://[^:]+:(\d+)", line)
            port = int(m.group(1)) if m else None
        if port is None:
            return "did not start: " + "".join(log)[-400:]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            return f"/health answered {r.status}"
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once upon a time", "max_tokens": 8}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        body = r.read().decode()
        if r.status != 200:
            return f"/v1/completions answered {r.status}: {body[:300]}"
        return ""
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def shutil_which(name):
    import shutil
    return shutil.which(name)


if __name__ == "__main__":
    sys.exit(main())
