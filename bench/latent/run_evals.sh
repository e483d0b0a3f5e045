#!/bin/sh
# Reruns the measurements of docs/LATENT.md: NIAH on models/retrieval.gguf (2,048 tokens, 5 depths)
# and fidelity on models/stories260K.gguf, for eviction alone, latent alone and their compositions.
# Usage (repository root, after building build/kvslim): bench/latent/run_evals.sh [OUT_DIR]
set -eu
K=${KVSLIM:-build/kvslim}
OUT=${1:-eval-out/latent}
T=${THREADS:-1}
mkdir -p "$OUT"
# Calibrated bases (shared by every request), fitted on bench/latent/retrieval_calib.txt: filler and
# needles of other keys and values than the evaluation's.
$K latent-calibrate -m models/retrieval.gguf --text bench/latent/retrieval_calib.txt --doc-tokens 2048 \
  --max-docs 4 --k-rank 64 --v-rank 64 --k-bits 8 --v-bits 8 -o "$OUT/retrieval_r64b8.gguf" -t $T
NIAH="-m models/retrieval.gguf --text-config models/retrieval.tasks.json --depths 0,0.25,0.5,0.75,1 --samples 1 -t $T --no-progress"
$K eval niah $NIAH --lengths 2048 --ratios 0 --no-baseline \
  --press "latent:k_rank=32,v_rank=32,k_bits=4,v_bits=4" -o "$OUT/niah2k_latent"
$K eval niah $NIAH --lengths 2048 --ratios 0.9,0.95,0.98 \
  --press kvzip "kvzip+latent:k_rank=32,v_rank=32,k_bits=8,v_bits=8" "kvzip+latent:file=$OUT/retrieval_r64b8.gguf" \
  -o "$OUT/niah2k"
FID="-m models/stories260K.gguf --samples 4 -t $T --no-progress"
$K eval fidelity $FID --ratios 0 --press \
  "latent:k_rank=8,v_rank=8,k_bits=2,v_bits=2,scales=token" "latent:k_rank=8,v_rank=8,k_bits=2,v_bits=2" \
  "latent:k_rank=8,v_rank=8,k_bits=4,v_bits=4,scales=token" "latent:k_rank=8,v_rank=8,k_bits=4,v_bits=4" \
  "latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8,scales=token" "latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8" \
  -o "$OUT/story_scales"
$K eval fidelity $FID --ratios 0.25,0.5,0.75 --press kvzip "kvzip+latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8" \
  -o "$OUT/story"

# ---- Cross-layer shared bases, 8K NIAH, the story model's curve ----
# Calibrated bases shared across adjacent layers (--share 0.02: a layer joins when the pooled basis
# keeps within 2% of the variance its own keeps).
$K latent-calibrate -m models/retrieval.gguf --text bench/latent/retrieval_calib.txt --doc-tokens 2048 \
  --max-docs 4 --k-rank 64 --v-rank 64 --k-bits 8 --v-bits 8 --share 0.02 -o "$OUT/retrieval_r64b8_share.gguf" -t $T
$K eval niah $NIAH --lengths 2048 --ratios 0.9,0.95,0.98 --no-baseline \
  --press "kvzip+latent:file=$OUT/retrieval_r64b8_share.gguf" -o "$OUT/niah2k_share"
# Sharing alone (per-request bases, no eviction): the bases' bytes are in the memory ratio.
$K eval niah $NIAH --lengths 2048 --ratios 0 --no-baseline \
  --press "latent:k_rank=32,v_rank=32,k_bits=8,v_bits=8" "latent:k_rank=32,v_rank=32,k_bits=8,v_bits=8,share=0.05" \
  -o "$OUT/niah2k_share_alone"
# 8,192 tokens: eviction + calibrated bases; full cache and eviction alone.
$K eval niah $NIAH --lengths 8192 --ratios 0.98,0.99 --no-baseline \
  --press "kvzip+latent:file=$OUT/retrieval_r64b8.gguf" -o "$OUT/niah8k"
$K eval niah $NIAH --lengths 8192 --ratios 0.99 --press kvzip -o "$OUT/niah8k_kvzip"
# Story model: eviction alone, latent alone (per-request and calibrated), sharing alone, compositions.
$K latent-calibrate -m models/stories260K.gguf --text models/story.txt --k-rank 8 --v-rank 8 --k-bits 8 \
  --v-bits 8 -o "$OUT/story_r8b8.gguf" -t $T
$K latent-calibrate -m models/stories260K.gguf --text models/story.txt --k-rank 8 --v-rank 8 --k-bits 8 \
  --v-bits 8 --share 1 -o "$OUT/story_r8b8_share.gguf" -t $T
$K eval fidelity $FID --ratios 0 --no-baseline --press "latent:file=$OUT/story_r8b8.gguf" \
  "latent:file=$OUT/story_r8b8_share.gguf" "latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8,share=1" \
  "latent:k_rank=7,v_rank=8,k_bits=8,v_bits=8" -o "$OUT/story_latent"
$K eval fidelity $FID --ratios 0.25,0.5,0.75,0.9 --press kvzip "kvzip+latent:file=$OUT/story_r8b8_share.gguf" \
  -o "$OUT/story_curve"
$K eval fidelity $FID --ratios 0.95,0.97,0.98 --no-baseline --press kvzip \
  "kvzip+latent:file=$OUT/story_r8b8_share.gguf" -o "$OUT/story_curve_hi"
# Decode speed over latent codes against the f16 cache of the same context (tokens per process CPU
# second, one thread).
$K bench -m models/retrieval.gguf -p 0 --depth 2048,8192 -n 32 -r 3 -t 1 --no-progress --press none \
  --press "latent:file=$OUT/retrieval_r64b8.gguf" --press "latent:k_rank=64,v_rank=64,k_bits=8,v_bits=8" \
  --compression-ratio 0 > "$OUT/bench_decode.txt" 2>&1
