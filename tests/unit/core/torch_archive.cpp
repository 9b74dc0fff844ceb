// lib/core's torch.save reader against well-formed and hostile archives, all generated here
// (tests/support/hostile_archives.h): nesting, object and memo limits, disallowed globals,
// tensor views outside their storage, zip bombs, CRC damage, cycles, truncation at every byte.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/torch_archive_load.h"
#include "support/hostile_archives.h"

using namespace fsdp;
using namespace fsdp::testing;
using namespace std::string_literals;

namespace {

std::vector<char> bytes_of(const std::string& s) {
  return std::vector<char>(s.begin(), s.end());
}

std::string floats(int n) {
  std::string b(static_cast<size_t>(n) * 4, '\0');
  for (int i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    std::memcpy(&b[static_cast<size_t>(i) * 4], &f, 4);
  }
  return b;
}

// One float tensor "x" with the given view of a 6-element storage (or another count).
std::string one_tensor(int64_t offset, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                       int64_t claimed_numel = 6, int stored = 6) {
  TensorSpec t{
      "x", "0", "FloatStorage", claimed_numel, offset, std::move(sizes), std::move(strides)};
  return make_torch_archive(pk_tensor_dict({t}), {{"0", floats(stored)}});
}

std::string load_error(const std::string& archive) {
  try {
    load_torch_archive(bytes_of(archive));
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a well-formed archive loads: values, views and shared storages", "[cpu]") {
  TensorSpec a{"a", "0", "FloatStorage", 6, 0, {2, 3}, {3, 1}};
  TensorSpec b{"b", "0", "FloatStorage", 6, 1, {2, 2}, {1, 3}};  // a strided view of the same
  const std::string arc = make_torch_archive(pk_tensor_dict({a, b}), {{"0", floats(6)}});
  const c10::IValue v = load_torch_archive(bytes_of(arc));
  REQUIRE(v.isGenericDict());
  const auto d = v.toGenericDict();
  const at::Tensor ta = d.at("a").toTensor(), tb = d.at("b").toTensor();
  CHECK(at::equal(ta, at::arange(6, at::kFloat).view({2, 3})));
  CHECK(at::equal(tb, at::arange(6, at::kFloat).as_strided({2, 2}, {1, 3}, 1)));
  CHECK(ta.storage().data() == tb.storage().data());
}

TEST_CASE("deep nesting, object, memo and string limits are named errors", "[cpu]") {
  // A million nested lists: built by APPEND chains; refused at the depth limit.
  const int deep = 1000000;
  std::string p = "\x80\x02" + std::string(deep, ']') + std::string(deep - 1, 'a') + ".";
  CHECK_THAT(load_error(make_torch_archive(p, {})), Catch::Contains("nesting deeper than"));
  // The same as nested tuples of one item.
  std::string t = "\x80\x02N" + std::string(deep, '\x85') + ".";
  CHECK_THAT(load_error(make_torch_archive(t, {})), Catch::Contains("nesting deeper than"));
  // Two million Nones in one list: the object limit.
  std::string many = "\x80\x02](" + std::string(2000000, 'N') + "e.";
  CHECK_THAT(load_error(make_torch_archive(many, {})), Catch::Contains("objects"));
  // A memo index never stored.
  CHECK_THAT(load_error(make_torch_archive("\x80\x02h\x07.", {})), Catch::Contains("memo key 7"));
  // A string claiming 4 GB.
  CHECK_THAT(load_error(make_torch_archive("\x80\x02X\xff\xff\xff\xff", {})),
             Catch::Contains("exceeds the limit"));
  // Shared references that would expand exponentially: L_{k+1} = [L_k, L_k], 40 levels.
  std::string dag = "\x80\x02]q\x00"s;
  for (int k = 0; k < 40; ++k)
    dag += "](h" + std::string(1, static_cast<char>(k)) + "h" +
           std::string(1, static_cast<char>(k)) + "eq" + std::string(1, static_cast<char>(k + 1)) +
           (k < 39 ? "0" : "");
  dag =
      "\x80\x02]q\x00"
      "0"s +
      dag.substr(5) + ".";
  CHECK_THAT(load_error(make_torch_archive(dag, {})), Catch::Contains("values to build"));
  // A list appended to itself: a cycle.
  CHECK_THAT(load_error(make_torch_archive("\x80\x02]q\x00h\x00"
                                           "a."s,
                                           {})),
             Catch::Contains("cycle"));
}

TEST_CASE("globals outside the allow-list and unknown opcodes are refused", "[cpu]") {
  CHECK_THAT(load_error(make_torch_archive("\x80\x02"
                                           "cos\nsystem\n" +
                                               pk_str("id") + "\x85R.",
                                           {})),
             Catch::Contains("'os.system', which is not allowed"));
  CHECK_THAT(load_error(make_torch_archive("\x80\x02"
                                           "cbuiltins\neval\n.",
                                           {})),
             Catch::Contains("not allowed"));
  CHECK_THAT(load_error(make_torch_archive("\x80\x02I1\n.", {})),
             Catch::Contains("unsupported pickle opcode"));
}

TEST_CASE("tensor records that do not fit their storage are refused", "[cpu]") {
  CHECK(load_error(one_tensor(0, {2, 3}, {3, 1})).empty());
  CHECK_THAT(load_error(one_tensor(0, {2, 3}, {1LL << 40, 1})), Catch::Contains("reaches past"));
  CHECK_THAT(load_error(one_tensor(0, {2, 3}, {INT64_MAX, 1})), Catch::Contains("overflows"));
  CHECK_THAT(load_error(one_tensor(-1, {2}, {1})), Catch::Contains("negative storage offset"));
  CHECK_THAT(load_error(one_tensor(0, {4, 3}, {3, 1})), Catch::Contains("reaches past"));
  CHECK_THAT(load_error(one_tensor(5, {2}, {1})), Catch::Contains("reaches past"));
  CHECK_THAT(load_error(one_tensor(0, {-2}, {1})), Catch::Contains("negative size"));
  CHECK_THAT(load_error(one_tensor(0, {2}, {-1})), Catch::Contains("negative stride"));
  // A storage that claims 10^12 elements over 24 bytes.
  CHECK_THAT(load_error(one_tensor(0, {2}, {1}, 1000000000000LL)),
             Catch::Contains("holds 24 bytes"));
  // A record shorter than its storage's claim.
  CHECK_THAT(load_error(one_tensor(0, {2}, {1}, 6, 5)), Catch::Contains("holds 20 bytes"));
  // A missing record.
  TensorSpec t{"x", "9", "FloatStorage", 6, 0, {6}, {1}};
  CHECK_THAT(load_error(make_torch_archive(pk_tensor_dict({t}), {{"0", floats(6)}})),
             Catch::Contains("has no record"));
  // Empty tensors need no storage bytes.
  CHECK(load_error(one_tensor(100, {0, 3}, {3, 1})).empty());
  // Bool storages hold only 0 and 1.
  TensorSpec m{"m", "0", "BoolStorage", 3, 0, {3}, {1}};
  CHECK(load_error(make_torch_archive(pk_tensor_dict({m}), {{"0", std::string("\x01\x00\x01", 3)}}))
            .empty());
  CHECK_THAT(
      load_error(make_torch_archive(pk_tensor_dict({m}), {{"0", std::string("\x01\x07\x01", 3)}})),
      Catch::Contains("other than 0 and 1"));
}

TEST_CASE("zip bombs, bad CRCs and lying sizes are refused before expanding", "[cpu]") {
  // A storage record deflated 3 MiB of zeros declaring 3 GiB: refused from the header alone.
  TensorSpec t{"x", "0", "FloatStorage", 6, 0, {6}, {1}};
  ZipMember bomb{"archive/data/0", std::string(3u << 20, '\0'), true, 3LL << 30};
  const std::string big = make_zip({{"archive/data.pkl", pk_tensor_dict({t})}, bomb});
  CHECK_THAT(load_error(big), Catch::Contains("zip bomb"));
  // A deflated record that declares fewer bytes than it expands to.
  ZipMember liar{"archive/data/0", floats(12), true, 24};
  CHECK_THAT(load_error(make_zip({{"archive/data.pkl", pk_tensor_dict({t})}, liar})),
             Catch::Contains("expands past"));
  // A deflated pickle is read once and works.
  CHECK(load_error(make_torch_archive(pk_tensor_dict({t}), {{"0", floats(6)}}, true)).empty());
  // One flipped byte in a stored record: the CRC-32 catches it.
  std::string arc = one_tensor(0, {6}, {1});
  const size_t at = arc.find(floats(6));
  REQUIRE(at != std::string::npos);
  arc[at + 5] ^= 0x10;
  CHECK_THAT(load_error(arc), Catch::Contains("CRC-32"));
  // A declared size other than the stored size.
  ZipMember odd{"archive/data/0", floats(6), false, 999};
  CHECK_THAT(load_error(make_zip({{"archive/data.pkl", pk_tensor_dict({t})}, odd})),
             Catch::Contains("stored entry"));
}

TEST_CASE("an archive cut at any byte or with any byte flipped is an error, never a crash",
          "[cpu]") {
  TensorSpec a{"a", "0", "FloatStorage", 6, 0, {2, 3}, {3, 1}};
  const std::string arc = make_torch_archive(pk_tensor_dict({a}), {{"0", floats(6)}});
  int errors = 0;
  for (size_t cut = 0; cut < arc.size(); ++cut) errors += !load_error(arc.substr(0, cut)).empty();
  CHECK(errors == static_cast<int>(arc.size()));
  // Every single-byte flip either loads (a byte the format does not check, e.g. a version
  // field) or is a FormatError; none may crash or throw anything else.
  for (size_t i = 0; i < arc.size(); ++i) {
    std::string d = arc;
    d[i] = static_cast<char>(d[i] ^ 0xff);
    try {
      load_torch_archive(bytes_of(d));
    } catch (const FormatError&) {
    }
  }
}

namespace {

// `bytes` written to a file of the test's own.
std::string file_with(const std::string& bytes, const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fsdp_archive_" + name + "_" + std::to_string(::getpid())))
                               .string();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

// The FormatError of opening `bytes` from a file and loading key "a" ("" when it loads).
std::string file_load_error(const std::string& bytes) {
  const std::string path = file_with(bytes, "cut");
  try {
    const FileSource file(path);
    load_torch_archive_keys(TorchArchive(file), {"a"});
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("from a file, only the records asked for are read", "[cpu]") {
  TensorSpec small{"ids", "0", "FloatStorage", 6, 0, {6}, {1}};
  TensorSpec big{"hidden", "1", "FloatStorage", 1 << 16, 0, {1 << 16}, {1}};
  const std::string arc =
      make_torch_archive(pk_tensor_dict({small, big}), {{"0", floats(6)}, {"1", floats(1 << 16)}});
  const std::string path = file_with(arc, "lazy");
  const FileSource file(path);
  const TorchArchive archive(file);
  const auto d = load_torch_archive_keys(archive, {"ids", "absent"});
  REQUIRE(d.size() == 1);
  CHECK(at::equal(d.at("ids").toTensor(), at::arange(6, at::kFloat)));
  INFO("read " << file.bytes_read() << " of " << arc.size() << " bytes");
  CHECK(file.bytes_read() < arc.size() / 16);
  // The same archive in memory gives the same tensor.
  CHECK(at::equal(load_torch_archive(bytes_of(arc)).toGenericDict().at("ids").toTensor(),
                  d.at("ids").toTensor()));
  // Not a dict: refused by name.
  const std::string list = make_torch_archive("\x80\x02].", {});
  CHECK_THAT(file_load_error(list), Catch::Contains("not a dict"));
  // A missing file is an I/O error carrying errno, not a format error.
  try {
    FileSource gone(path + ".gone");
    FAIL("opened a missing file");
  } catch (const ZipIoError& e) {
    CHECK(e.error_number == ENOENT);
  }
  std::filesystem::remove(path);
}

TEST_CASE("from a file, an archive cut at any byte is the error it is in memory", "[cpu]") {
  TensorSpec a{"a", "0", "FloatStorage", 6, 0, {2, 3}, {3, 1}};
  const std::string arc = make_torch_archive(pk_tensor_dict({a}), {{"0", floats(6)}});
  for (size_t cut = 0; cut < arc.size(); ++cut) {
    INFO("cut at " << cut);
    const std::string in_memory = load_error(arc.substr(0, cut));
    REQUIRE_FALSE(in_memory.empty());
    CHECK(file_load_error(arc.substr(0, cut)) == in_memory);
  }
  CHECK(file_load_error(arc).empty());
}
