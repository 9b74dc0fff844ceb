// FLOP counts of one training step from the config (2 FLOPs per multiply-add). Elementwise
// work (norms, RoPE, softmax, loss) is left out: it is a rounding error next to the matmuls.
#include "model/flops.h"

#include <algorithm>

#include "core/error.h"

namespace fsdp::model {

StepFlops count_step_flops(const DraftConfig& cfg, int64_t batch, int64_t seq, int64_t ttt_length) {
  return count_step_flops(
      cfg, batch, seq, ttt_length,
      std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(ttt_length, 0)), batch * seq));
}

StepFlops count_step_flops(const DraftConfig& cfg, int64_t batch, int64_t seq, int64_t ttt_length,
                           const std::vector<int64_t>& head_rows) {
  return count_step_flops(
      cfg, std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(batch, 0)), seq), ttt_length,
      head_rows);
}

StepFlops count_step_flops(const DraftConfig& cfg, const std::vector<int64_t>& lengths,
                           int64_t ttt_length, const std::vector<int64_t>& head_rows) {
  FSDP_CHECK(static_cast<int64_t>(head_rows.size()) == ttt_length,
             fsdp::str("head_rows has ", head_rows.size(), " entries, ttt_length is ", ttt_length),
             "pass one row count per TTT step");
  double N = 0, causal_pairs = 0;  // tokens; causal (query, key) pairs per head
  for (const int64_t L : lengths) {
    const auto l = static_cast<double>(L);
    N += l;
    causal_pairs += l * (l + 1) / 2;
  }
  const double H = static_cast<double>(cfg.hidden_size);
  const double I = static_cast<double>(cfg.intermediate_size);
  const double q_out = static_cast<double>(cfg.q_out_features());
  const double kv_out = static_cast<double>(cfg.kv_out_features());
  const double heads_dim = static_cast<double>(cfg.num_attention_heads * cfg.head_dim_value());
  const double Vd = static_cast<double>(cfg.draft_vocab());
  const double V = static_cast<double>(cfg.vocab_size);

  const double fc = 2 * N * static_cast<double>(cfg.fc_in_features()) * H;
  // The first decoder layer reads [embedding, hidden] (2H); later layers of a multi-layer draft
  // read H. Every layer attends over the same pairs.
  const double layers = static_cast<double>(cfg.num_hidden_layers);
  const double layer = 2 * N * (2 * H * (q_out + 2 * kv_out) + q_out * H + 3 * H * I) +
                       (layers - 1) * 2 * N * (H * (q_out + 2 * kv_out) + q_out * H + 3 * H * I);
  const auto head = [&](int64_t i) {
    return 2 * static_cast<double>(head_rows[static_cast<size_t>(i)]) * H * Vd;
  };
  // Causal: L(L+1)/2 visible (query, key) pairs per sequence of length L and head; QK^T and PV
  // each cost 2 * d FLOPs per pair. Step i adds i diagonal keys per query.
  StepFlops f;
  for (int64_t i = 0; i < ttt_length; ++i) {
    const double pairs = causal_pairs + N * static_cast<double>(i);
    const double attn = 4 * heads_dim * pairs * layers;
    f.attention += attn;
    f.forward += layer + head(i) + attn;
    f.backward += 2 * (layer + head(i) + attn);
  }
  f.forward += fc;
  f.backward += fc;  // weight gradient only: the aux hidden states need no gradient
  const double target_rows = ttt_length > 0 ? static_cast<double>(head_rows[0]) : N;
  f.target_head = 2 * target_rows * H * (Vd + V);
  return f;
}

}  // namespace fsdp::model
