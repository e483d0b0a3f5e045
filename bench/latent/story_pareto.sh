#!/bin/sh
# The story model's composition space for the latent KV fidelity targets (docs/LATENT.md, "Story
# model: the composition space"): eviction presses x ratios, KV codecs for keys and values apart,
# latent codes from calibrated bases (8/8, 8/4, f16/8 bits; per-channel or per-token scales), and
# cross-layer entry sharing (press cla), each on `kvslim eval fidelity`'s default sampled text
# (4 samples, 256 context + 128 teacher-forced tokens). bench/latent/pareto.py reads the summaries
# and prints the Pareto front of memory ratio (after compression) against KL and top-1.
# Usage (repository root, after building build/kvslim): bench/latent/story_pareto.sh [OUT_DIR]
set -eu
K=${KVSLIM:-build/kvslim}
OUT=${1:-eval-out/story_pareto}
T=${THREADS:-1}
mkdir -p "$OUT"
M=models/stories260K.gguf
# Calibrated bases (full rank 8 of head_dim 8; the bits are per side), fitted on models/story.txt,
# which is not the evaluation's text (the harness samples its own from the model, seeded).
for kb in "8 8" "8 4" "0 8"; do
  set -- $kb
  $K latent-calibrate -m $M --text models/story.txt --k-rank 8 --v-rank 8 --k-bits $1 --v-bits $2 \
    -o "$OUT/story_r8_k$1v$2.gguf" -t $T > /dev/null
done
S88="$OUT/story_r8_k8v8.gguf" S84="$OUT/story_r8_k8v4.gguf" S08="$OUT/story_r8_k0v8.gguf"
FID="-m $M --samples 4 -t $T --no-progress --no-plot"
# 1. Eviction alone: every scorer at 0.5 .. 0.9, then the best (kvzip, kvzip+) finer and higher.
$K eval fidelity $FID --ratios 0.5,0.6,0.7,0.8,0.9 --press kvzip kvzip:plus=1 expected_attention snapkv tova \
  compactor cap cur keydiff knorm lagkv kvcompose -o "$OUT/evict_scorers"
$K eval fidelity $FID --no-baseline --ratios 0.55,0.65,0.75,0.85,0.93,0.95,0.96,0.962,0.966,0.97 \
  --press kvzip kvzip:plus=1 -o "$OUT/evict_kvzip"
# 2. KV codecs alone and under kvzip (keys and values apart; KIVI without a residual window).
for c in "q8_0 q8_0" "q8_0 q4_0" "q4_0 q8_0" "q4_0 q4_0" "f16 q8_0" "f16 q4_0" "f16 q2_1" "q8_0 q2_1" "q2_1 q2_1"; do
  set -- $c
  $K eval fidelity $FID --no-baseline --ratios 0,0.6,0.9 --press kvzip --cache-type-k $1 --cache-type-v $2 \
    -o "$OUT/codec_k$1_v$2"
done
$K eval fidelity $FID --no-baseline --ratios 0,0.6,0.9 --press kvzip --cache-type-k q4_0 --cache-type-v q4_0 \
  --kv-hadamard -o "$OUT/codec_kq4_0_vq4_0_hadamard"
for b in 4 2; do
  $K eval fidelity $FID --no-baseline --ratios 0,0.6,0.9 --press kvzip --kivi-bits $b --kivi-residual 0 \
    -o "$OUT/codec_kivi$b"
done
# 3. Latent codes alone (calibrated bases, shared by every request: not in the memory ratio).
$K eval fidelity $FID --no-baseline --ratios 0 --press "latent:file=$S88" "latent:file=$S84" "latent:file=$S08" \
  "latent:file=$S88,scales=token" "latent:file=$S84,scales=token" "latent:file=$S08,scales=token" \
  -o "$OUT/latent_alone"
# 4. Eviction + latent codes.
$K eval fidelity $FID --no-baseline --ratios 0.55,0.6,0.65,0.7,0.75,0.8,0.85,0.9 \
  --press "kvzip+latent:file=$S88" "kvzip+latent:file=$S08,scales=token" "kvzip:plus=1+latent:file=$S08,scales=token" \
  "kvzip:plus=1+latent:file=$S88,scales=token" "kvzip:plus=1+latent:file=$S84,scales=token" \
  -o "$OUT/evict_latent_mid"
$K eval fidelity $FID --no-baseline --ratios 0.9,0.93,0.95,0.955,0.96,0.962,0.966,0.97 \
  --press "kvzip+latent:file=$S88" "kvzip+latent:file=$S88,scales=token" "kvzip+latent:file=$S84,scales=token" \
  "kvzip:plus=1+latent:file=$S84,scales=token" "kvzip:plus=1+latent:file=$S88,scales=token" \
  -o "$OUT/evict_latent_hi"
# 5. Cross-layer entry sharing (press cla): alone (the layer closest to its predecessor by the
# measured difference, two such layers, each layer given), and after eviction / before latent codes.
$K eval fidelity $FID --no-baseline --ratios 0 --press cla:n=1 cla:n=2 cla:layers=1 cla:layers=2 cla:layers=3 \
  cla:layers=4 -o "$OUT/cla_alone"
$K eval fidelity $FID --no-baseline --ratios 0.5,0.9 --press "kvzip:plus=1+cla:layers=2" \
  "kvzip:plus=1+cla:layers=2+latent:file=$S84,scales=token" -o "$OUT/evict_cla"
# 6. Bits chosen by measured KL (latent-calibrate --target-kl): the last 256-token document of
# models/story.txt held out, KL over its last quarter.
for t in 0.001 0.005 0.05; do
  for sc in channel token; do
    $K latent-calibrate -m $M --text models/story.txt --doc-tokens 256 --k-rank 8 --v-rank 8 --target-kl $t \
      --kl-scales $sc -o "$OUT/story_kl${t}_$sc.gguf" -t $T > "$OUT/story_kl${t}_$sc.txt"
  done
done
