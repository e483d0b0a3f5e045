#!/bin/sh
# Decode speed of attention over latent codes against the f16 cache of the same context
# (docs/LATENT.md, "Decode speed of attention over codes"): each round is one `kvslim bench`
# invocation running the f16 cache and the latent cache one after the other, so the two sides of a
# ratio share the machine's load; decode tokens per process CPU second, one thread.
# Usage (repository root, after building build/kvslim): bench/latent/decode_speed.sh [OUT_DIR] [ROUNDS]
# (N=tokens decoded per repetition, default 256; 32 left the figures at +-20% on a loaded machine)
set -eu
N=${N:-256}
K=${KVSLIM:-build/kvslim}
OUT=${1:-eval-out/latent}
ROUNDS=${2:-3}
mkdir -p "$OUT"
# Retrieval model: calibrated rank-64 bases of head_dim 192, 8-bit codes (as run_evals.sh fits them).
[ -f "$OUT/retrieval_r64b8.gguf" ] || $K latent-calibrate -m models/retrieval.gguf \
  --text bench/latent/retrieval_calib.txt --doc-tokens 2048 --max-docs 4 --k-rank 64 --v-rank 64 \
  --k-bits 8 --v-bits 8 -o "$OUT/retrieval_r64b8.gguf" -t 1
for r in $(seq "$ROUNDS"); do
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  for d in 2048 8192; do
    $K bench -m models/retrieval.gguf -p 0 --depth $d -n $N -r 3 -t 1 --press none \
      --press "latent:file=$OUT/retrieval_r64b8.gguf" --compression-ratio 0 2>&1 | grep "tokens per process CPU second"
  done
  # Story model (head_dim 8): per-request full-rank bases, 8-bit and 4-bit codes.
  $K bench -m models/stories260K.gguf -p 0 --depth 1024 -n $N -r 3 -t 1 --press none \
    --press "latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8" --press "latent:k_rank=8,v_rank=8,k_bits=4,v_bits=4" \
    --compression-ratio 0 2>&1 | grep "tokens per process CPU second"
done | tee -a "$OUT/bench_decode_alternating.txt"
