// lib/core: error formatting (also of LibTorch exceptions), usage errors, log levels, timers and
// dtype tables.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/fs_util.h"
#include "core/log.h"
#include "core/timer.h"

using namespace fsdp;

TEST_CASE("FSDP_CHECK throws Error with location, message and hint", "[cpu]") {
  try {
    FSDP_CHECK(1 + 1 == 3, str("arithmetic is off by ", 1), "check the universe");
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.message() == "arithmetic is off by 1");
    CHECK(e.hint() == "check the universe");
    CHECK(e.location().rfind("core_basics.cpp:", 0) == 0);
    std::string what = e.what();
    CHECK(what.find("---> HINT: check the universe") != std::string::npos);
    CHECK(what.find("core_basics.cpp:") != std::string::npos);
  }
}

TEST_CASE("FSDP_CHECK does not evaluate the message when the condition holds", "[cpu]") {
  int evaluated = 0;
  auto msg = [&]() {
    ++evaluated;
    return std::string("x");
  };
  FSDP_CHECK(true, msg(), msg());
  CHECK(evaluated == 0);
}

TEST_CASE("FSDP_USAGE_CHECK throws UsageError, an Error", "[cpu]") {
  CHECK_THROWS_AS([] { FSDP_USAGE_CHECK(false, "bad flag --x", "use --y"); }(), UsageError);
  try {
    FSDP_USAGE_CHECK(false, "bad flag --x", "use --y");
  } catch (const Error& e) {
    CHECK(e.message() == "bad flag --x");
  }
}

TEST_CASE("log levels parse and gate output", "[cpu]") {
  CHECK(log::parse_level("DEBUG") == log::Level::kDebug);
  CHECK(log::parse_level("warning") == log::Level::kWarn);
  CHECK(log::parse_level("off") == log::Level::kOff);
  CHECK_THROWS_AS(log::parse_level("loud"), UsageError);
  const auto saved = log::level();
  log::set_level(log::Level::kWarn);
  CHECK_FALSE(log::enabled(log::Level::kInfo));
  CHECK(log::enabled(log::Level::kError));
  log::set_level(saved);
}

TEST_CASE("timers accumulate per name", "[cpu]") {
  TimeAccumulator acc;
  {
    ScopedTimer t(acc, "sleep");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  acc.add("sleep", 0.5);
  CHECK(acc.count("sleep") == 2);
  CHECK(acc.total("sleep") >= 0.5 + 0.019);
  CHECK(acc.total("missing") == 0.0);
  acc.reset();
  CHECK(acc.totals().empty());
}

TEST_CASE("dtype tables round-trip", "[cpu]") {
  for (auto t : {c10::kFloat, c10::kBFloat16, c10::kHalf, c10::kDouble, c10::kLong, c10::kInt,
                 c10::kShort, c10::kChar, c10::kByte, c10::kBool}) {
    CHECK(dtype_from_safetensors(dtype_to_safetensors(t)) == t);
  }
  CHECK(parse_dtype("bf16") == c10::kBFloat16);
  CHECK(parse_dtype("fp32") == c10::kFloat);
  CHECK(dtype_size(c10::kBFloat16) == 2);
  CHECK_THROWS_AS(parse_dtype("int3"), UsageError);
  CHECK_THROWS_AS(dtype_from_safetensors("F8_E5M2"), UsageError);
}

TEST_CASE("all_finite finds one NaN or Inf in any position and dtype", "[cpu]") {
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    at::Tensor t = at::randn({64, 33}).to(dt);
    CHECK(all_finite(t));
    for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
      for (int64_t pos : {int64_t{0}, int64_t{1000}, t.numel() - 1}) {
        at::Tensor u = t.clone();
        u.view({-1})[pos] = bad;
        CHECK_FALSE(all_finite(u));
        CHECK_FALSE(all_finite(u.narrow(0, pos / 33, 1)));  // a view holding it
      }
    }
  }
  CHECK(all_finite(at::empty({0, 4})));
  CHECK_FALSE(all_finite(at::ones({3}, at::kLong)));  // not floating point
  // Largest finite values are finite.
  CHECK(all_finite(at::full({2}, 3.0e38f)));
}

TEST_CASE("remove_tree removes nested directories without std::filesystem::remove_all", "[cpu]") {
  const std::string root = "/tmp/fsdp_remove_tree_test_" + std::to_string(::getpid());
  std::filesystem::create_directories(root + "/a/b/c");
  { std::ofstream(root + "/a/b/c/file") << "x"; }
  { std::ofstream(root + "/a/top") << "y"; }
  CHECK(remove_tree(root));
  CHECK_FALSE(std::filesystem::exists(root));
  CHECK(remove_tree(root));  // absent: fine
}

TEST_CASE("exceptions read for users: no LibTorch backtrace; allocation failures recognised",
          "[cpu]") {
  try {
    TORCH_CHECK(false, "the tensor has 3 dims");
  } catch (const std::exception& e) {
    CHECK(fsdp::error_text(e).find("the tensor has 3 dims") != std::string::npos);
    CHECK(fsdp::error_text(e).find("frame #") == std::string::npos);
    CHECK_FALSE(fsdp::is_out_of_memory(e));
  }
  // The CPU allocator's real failure: 1 PiB.
  try {
    auto t = at::empty({int64_t{1} << 50}, at::kByte);
    FAIL("a 1 PiB allocation succeeded");
  } catch (const std::exception& e) {
    INFO(fsdp::error_text(e));
    CHECK(fsdp::is_out_of_memory(e));
  }
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB");
  } catch (const std::exception& e) {
    CHECK(fsdp::is_out_of_memory(e));
  }
  CHECK(fsdp::is_out_of_memory(std::bad_alloc()));
  CHECK_FALSE(fsdp::is_out_of_memory(std::runtime_error("can't allocate memory")));
  CHECK(fsdp::error_text(std::runtime_error("plain")) == "plain");
}

TEST_CASE("an error quoted inside another keeps one HINT line: the outer one", "[cpu]") {
  try {
    FSDP_USAGE_CHECK(false, "shard_0.pt: damaged", "the state file is damaged");
  } catch (const fsdp::UsageError& inner) {
    const std::string quoted = fsdp::error_text(inner);
    CHECK(quoted.find("shard_0.pt: damaged (") == 0);
    CHECK(quoted.find("HINT") == std::string::npos);
    CHECK(quoted.find('\n') == std::string::npos);
    const fsdp::UsageError outer("--resume: cannot load: " + quoted, "pick another checkpoint",
                                 __FILE__, __LINE__);
    const std::string all = outer.what();
    size_t hints = 0;
    for (size_t p = all.find("---> HINT:"); p != std::string::npos;
         p = all.find("---> HINT:", p + 1))
      ++hints;
    CHECK(hints == 1);
  }
}
