#pragma once
// Queries and pre-RoPE keys of the context tokens, recomputed from the recorded layer-input hidden
// states (ObservationNeeds::hidden_states) as the forward pass computes them: RMSNorm with the
// layer's attention norm, W_q / W_k (+ biases), and for queries RoPE at the token's position.
// kvpress's get_prerope_query_states / get_prerope_key_states. Internal to src/press.
#include <cstdint>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// For every entry of segment `kv_head`, the row of Observation::hidden[layer] holding its token
/// (matched by position). Throws kvslim::Error naming `press` when an entry has no recorded state
/// (entries of an earlier prefill step: the press needs the whole context in one step).
std::vector<int> hidden_rows(const LayerView& view, int kv_head, const char* press);

/// Queries of the tokens at `rows`, [rows][n_head][head_dim], RoPE applied at each token's position.
std::vector<float> queries_from_hidden(const LayerView& view, const std::vector<int>& rows);

/// Keys before RoPE of the tokens at `rows` for KV head `kv_head`, [rows][head_dim].
std::vector<float> prerope_keys_from_hidden(const LayerView& view, int kv_head, const std::vector<int>& rows);

/// Mean and unbiased standard deviation (as torch's Tensor.std()) over all values of `x`.
void mean_std(const std::vector<std::vector<double>>& x, double& mean, double& std);

}  // namespace kvslim
