#!/usr/bin/env python3
"""kvslim under an address-space limit (`ulimit -v`, RLIMIT_AS): every run ends, by itself, within
a timeout. At 256 MiB and above `generate` succeeds at 1, 2 and 4 threads; below, it either
succeeds or exits 1 with an error of kvslim's that names the limit. `--version` succeeds at every
limit. Regression for two failures of OpenBLAS's worker threads, which started when the library
loaded: a hang at exit between 128 and 192 MiB (the main thread waited in OpenBLAS's shutdown on a
worker stuck in OpenBLAS's allocator, which retries a failed mmap forever), and at 64 MiB an exit
130 with OpenBLAS's "pthread_create failed" instead of an error of ours.

`serve` too: at every limit it either answers /health with 200 or exits 1 with an error of
kvslim's, within the timeout; from 256 MiB it serves. Regression: its 76 HTTP worker threads took
8 MiB of address space each, and under 512 MiB the HTTP library's pool, failing half-way through
its constructor, waited forever on the threads it had started (no output, no exit).

Usage: memory_limits.py KVSLIM MODEL   (exit 0: every run behaved)
"""
import resource
import subprocess
import sys

LIMITS_MIB = [64, 96, 128, 160, 192, 256]
SUCCEEDS_FROM_MIB = 256
# Below the limit that must succeed, one thread and several (a thread that cannot start) suffice.
THREADS_BELOW = [1, 4]
THREADS = [1, 2, 4]
# A run takes well under a second; a hang shows as a timeout.
TIMEOUT_S = 20
# About 60 tokens: prefill runs the batched products (BLAS), decode the per-token ones.
PROMPT = "Once upon a time there was a little girl named Lily. She liked to play in the park. " * 3


def run(limit_mib, args):
    def limit():
        b = limit_mib << 20
        resource.setrlimit(resource.RLIMIT_AS, (b, b))

    try:
        p = subprocess.run(args, preexec_fn=limit, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, ""
    return p.returncode, p.stderr


def serve(limit_mib, kvslim, model):
    """("served" | "exit N" | "hung", stderr) of `kvslim serve` on a free port under the limit."""
    import http.client
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limit():
        b = limit_mib << 20
        resource.setrlimit(resource.RLIMIT_AS, (b, b))

    p = subprocess.Popen([kvslim, "serve", "-m", model, "--port", str(port), "-t", "2"], preexec_fn=limit,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    status = "hung"
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline:
        if p.poll() is not None:
            status = f"exit {p.returncode}"
            break
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                status = "served"
                break
        except OSError:
            pass
        time.sleep(0.1)
    if p.poll() is None:
        p.kill()
    err = p.communicate(timeout=30)[1]
    return status, err


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    kvslim, model = sys.argv[1], sys.argv[2]
    failures = []
    for mib in LIMITS_MIB:
        rc, err = run(mib, [kvslim, "--version"])
        print(f"{mib:4d} MiB  --version: rc {rc}")
        if rc != 0:
            failures.append(f"{mib} MiB --version: rc {rc} (None = timed out): {err.strip()[-300:]}")
        for t in THREADS if mib >= SUCCEEDS_FROM_MIB else THREADS_BELOW:
            rc, err = run(mib, [kvslim, "generate", "-m", model, "-p", PROMPT, "-n", "6", "--temp", "0", "-t", str(t)])
            last = err.strip().splitlines()[-1] if err.strip() else ""
            print(f"{mib:4d} MiB  generate -t {t}: rc {rc}  {last if rc else ''}")
            if rc is None:
                failures.append(f"{mib} MiB generate -t {t}: timed out after {TIMEOUT_S} s")
            elif mib >= SUCCEEDS_FROM_MIB and rc != 0:
                failures.append(f"{mib} MiB generate -t {t}: rc {rc}, expected success: {err.strip()[-300:]}")
            elif rc != 0 and (rc != 1 or not last.startswith("error:") or "ulimit -v" not in last):
                failures.append(f"{mib} MiB generate -t {t}: rc {rc}, expected 0 or 1 with an error naming the "
                                f"limit: {err.strip()[-300:]}")
    for mib in LIMITS_MIB:
        status, err = serve(mib, kvslim, model)
        print(f"{mib:4d} MiB  serve: {status}")
        if status == "hung":
            failures.append(f"{mib} MiB serve: neither served nor exited within {TIMEOUT_S} s: {err.strip()[-300:]}")
        elif mib >= SUCCEEDS_FROM_MIB and status != "served":
            failures.append(f"{mib} MiB serve: {status}, expected /health 200: {err.strip()[-300:]}")
        elif status.startswith("exit") and (status != "exit 1" or "error:" not in err):
            failures.append(f"{mib} MiB serve: {status}, expected exit 1 with an error of ours: {err.strip()[-300:]}")
    for f in failures:
        print("FAIL " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
