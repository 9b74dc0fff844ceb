// Metrics stuck at exactly 0 (see stuck_metrics.h).
#include "train/stuck_metrics.h"

#include "core/error.h"

namespace fsdp::train {

ZeroMetricWatch::ZeroMetricWatch(std::string prefix, std::string reports, int64_t needed)
    : prefix_(std::move(prefix)), reports_(std::move(reports)), needed_(needed) {}

std::string ZeroMetricWatch::observe(const std::vector<std::pair<std::string, double>>& scalars) {
  // Whether the report has the family at all, and whether every member is exactly 0.
  const auto all_zero = [&](const std::string& family, bool* seen) {
    const std::string start = prefix_ + "/" + family + "_";
    bool zero = true;
    *seen = false;
    for (const auto& [k, v] : scalars) {
      if (k.rfind(start, 0) != 0 || k.size() == start.size() ||
          k.find_first_not_of("0123456789", start.size()) != std::string::npos) {
        continue;
      }
      *seen = true;
      zero = zero && v == 0.0;
    }
    return zero;
  };
  bool has_ploss = false, has_acc = false;
  const bool ploss = all_zero("ploss", &has_ploss);
  const bool acc = all_zero("acc", &has_acc);
  if (!has_ploss && !has_acc) return "";
  zero_ploss_ = has_ploss && ploss ? zero_ploss_ + 1 : 0;
  zero_acc_ = has_acc && acc ? zero_acc_ + 1 : 0;
  const bool say_ploss = zero_ploss_ == needed_;
  const bool say_acc = zero_acc_ == needed_;
  if (!say_ploss && !say_acc) return "";
  std::string what;
  if (say_ploss) what = prefix_ + "/ploss_* (every TTT step's loss)";
  if (say_acc)
    what += std::string(what.empty() ? "" : " and ") + prefix_ + "/acc_* (every step's accuracy)";
  return fsdp::str(
      what, (say_ploss && say_acc ? " have" : " has"), " been exactly 0 for ", needed_,
      " consecutive ", reports_,
      ": the draft is learning nothing or being measured on nothing. Likely causes: empty loss "
      "masks (no token counts for the loss), a wrong chat template or assistant markers when the "
      "features were generated, or a d2t that maps none of the target tokens the data uses. "
      "Hint: check the start-up lines '... loss tokens in ... tokens' and 'vocab mapping: "
      "...' coverage, and docs/data.md 'Loss masks'; training goes on");
}

}  // namespace fsdp::train
