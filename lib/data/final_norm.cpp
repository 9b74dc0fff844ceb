// The final-norm wrapper for pre-norm feature dumps (final_norm.h).
#include "data/final_norm.h"

#include <ATen/ATen.h>

namespace fsdp::data {

at::Tensor apply_final_norm(const at::Tensor& hidden, const at::Tensor& weight, double eps) {
  const at::Tensor x = hidden.to(at::kFloat);
  const at::Tensor normed = (x * at::rsqrt(x.pow(2).mean(-1, true) + eps)).to(hidden.scalar_type());
  return (weight.to(hidden.scalar_type()) * normed).contiguous();
}

namespace {

class FinalNormDataset final : public FeatureDataset {
 public:
  FinalNormDataset(std::shared_ptr<FeatureDataset> inner, at::Tensor weight, double eps)
      : inner_(std::move(inner)), weight_(std::move(weight)), eps_(eps) {}
  std::string format() const override { return inner_->format(); }
  int64_t size() const override { return inner_->size(); }
  RawSample read(int64_t i) const override {
    RawSample s = inner_->read(i);
    sync_counters();
    if (!s.hidden_state.defined()) return s;  // an algorithm without use for it (DFlash)
    FSDP_USAGE_CHECK(s.hidden_state.size(1) == weight_.size(0),
                     fsdp::str(s.source, ": hidden size ", s.hidden_state.size(1),
                               " but the target's final norm has ", weight_.size(0)),
                     "use features dumped from --target-model-path");
    s.hidden_state = apply_final_norm(s.hidden_state, weight_, eps_);
    return s;
  }
  TokenSample read_tokens(int64_t i) const override {
    TokenSample s = inner_->read_tokens(i);
    sync_counters();
    return s;
  }
  TokenSample read_tokens_only(int64_t i) const override {
    TokenSample s = inner_->read_tokens_only(i);
    sync_counters();
    return s;
  }
  std::string source(int64_t i) const override { return inner_->source(i); }
  std::string source_key(int64_t i) const override { return inner_->source_key(i); }
  uint64_t source_bytes(int64_t i) const override { return inner_->source_bytes(i); }
  const std::string& root() const override { return inner_->root(); }
  bool hidden_state_prenorm() const override { return false; }
  std::vector<int64_t> captured_layer_ids() const override { return inner_->captured_layer_ids(); }

 private:
  void sync_counters() const {
    files_opened_ = inner_->files_opened();
    bytes_read_ = inner_->bytes_read();
  }
  std::shared_ptr<FeatureDataset> inner_;
  at::Tensor weight_;
  double eps_;
};

}  // namespace

std::shared_ptr<FeatureDataset> with_final_norm(std::shared_ptr<FeatureDataset> inner,
                                                const at::Tensor& weight, double eps) {
  return std::make_shared<FinalNormDataset>(std::move(inner), weight.to(at::kFloat).contiguous(),
                                            eps);
}

}  // namespace fsdp::data
