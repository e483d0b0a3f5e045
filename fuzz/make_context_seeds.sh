#!/usr/bin/env bash
# Writes fuzz/corpus/context/: small stored contexts of the bundled model (one per cache layout the
# reader knows), as whole files and as bare payloads (the fuzz target gives a payload a valid header).
# Usage: fuzz/make_context_seeds.sh path/to/kvslim   (from the repository root)
set -euo pipefail
KVSLIM=${1:?usage: $0 path/to/kvslim}
OUT=fuzz/corpus/context
mkdir -p "$OUT"
TEXT="Once upon a time there was a cat. It liked milk."
M=models/stories260K.gguf
build() {  # name, flags...
  local name=$1
  shift
  "$KVSLIM" context build -m "$M" -p "$TEXT" --no-progress -o "$OUT/$name.kvc" "$@" > /dev/null
  tail -c +33 "$OUT/$name.kvc" > "$OUT/$name.payload"
  # one whole file, the others as payloads
  if [ "$name" = f16_snapkv ]; then rm "$OUT/$name.payload"; else rm "$OUT/$name.kvc"; fi
}
build f16_snapkv --press snapkv --compression-ratio 0.5
build q8_q4_adakv --press 'adakv(snapkv)' --compression-ratio 0.5 --cache-type-k q8_0 --cache-type-v q4_0
build kivi2 --press snapkv --compression-ratio 0.3 --kivi-bits 2 --kivi-group 4 --kivi-residual 4
build leankv --press 'leankv(snapkv)' --compression-ratio 0.3
build latent --press 'latent:k_rank=4,v_rank=4,k_bits=4,v_bits=8'
build cla --press 'cla:layers=1/3'
