// Helpers shared by the data unit tests: temporary directories, hand-made .ckpt files and
// capturing error messages. Test-only.
#pragma once

#include <ATen/ATen.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/fs_util.h"
#include "data/torch_save.h"
#include "support/test_paths.h"

namespace fsdp::data::testing {

inline std::filesystem::path temp_dir(const std::string& name) {
  // ostringstream rather than operator+: GCC 12 -O2 warns falsely (-Warray-bounds) on the latter.
  std::ostringstream leaf;
  leaf << "fsdp_data_" << name << "_" << ::getpid();
  auto p = std::filesystem::temp_directory_path() / leaf.str();
  fsdp::remove_tree(p.string());
  std::filesystem::create_directories(p);
  return p;
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_ckpt(const std::filesystem::path& p,
                       const c10::Dict<std::string, at::Tensor>& d) {
  write_bytes(p, fsdp::data::torch_save_bytes(d));
}

// A valid sample of S tokens and hidden size H whose values encode `tag` (for identity checks).
inline c10::Dict<std::string, at::Tensor> make_sample(int64_t s, int64_t h, int64_t tag) {
  c10::Dict<std::string, at::Tensor> d;
  d.insert("input_ids", at::arange(s, at::kLong) + tag);
  at::Tensor mask = at::ones({s}, at::kLong);
  mask[0] = 0;
  d.insert("loss_mask", mask);
  d.insert("hidden_state",
           (at::arange(s * h, at::kFloat).view({1, s, h}) / 64.0 + tag).to(at::kBFloat16));
  d.insert("aux_hidden_state",
           (at::arange(s * 3 * h, at::kFloat).view({1, s, 3 * h}) / 64.0 - tag).to(at::kBFloat16));
  return d;
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fsdp::Error& e) {
    return e.message();
  }
  return "<no error>";
}

// Runs a script with the venv's Python (interop checks); returns the exit status.
inline int run_python(const std::filesystem::path& script) {
  std::ostringstream cmd;
  cmd << FSDP_PYTHON << " " << script.string();
  return std::system(cmd.str().c_str());
}

inline bool have_python() {
  const std::string py = FSDP_PYTHON;
  return !py.empty() && std::filesystem::exists(py);
}

}  // namespace fsdp::data::testing
