#pragma once
// The per-entry widening of per-channel latent codes (LatentScales::Channel in
// src/kv/latent.h): an entry with exponent byte e has every coordinate's step
// multiplied by 2^(e/4). One table, read by the codes' encoder and decoder (src/kv/latent.cpp) and
// by the kernels that read raw codes (src/attention/latent_code_dot.cpp), so all agree bit for bit.

namespace kvslim {

/// 256 floats: entry e is std::exp2(0.25f * e), e in [0, 255].
const float* latent_widen_table();

}  // namespace kvslim
