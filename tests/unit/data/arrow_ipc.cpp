// The Arrow IPC stream reader on bytes pyarrow wrote: values of every readable column type,
// columns of other types stepped over, and damaged input (cut short anywhere, any metadata byte
// flipped, a length or list offset past its buffer) refused with an error, never a crash.
#include "data/arrow_ipc.h"

#include <catch2/catch.hpp>

#include "arrow_test_bytes.h"
#include "test_util.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {
using Ints = std::vector<int64_t>;

// Reads every readable value of every row; the reader must either return or throw a UsageError.
void read_everything(const ArrowStreamFile& f) {
  for (int c = 0; c < f.num_columns(); ++c)
    for (int64_t r = 0; r < f.num_rows(); ++r) {
      try {
        if (f.column_type(c) == "int64")
          f.int_value(c, r);
        else
          f.int_list(c, r);
      } catch (const fsdp::UsageError&) {
      }
    }
}
}  // namespace

TEST_CASE("arrow: pyarrow's stream reads row by row, other columns skipped", "[arrow]") {
  const auto dir = temp_dir("arrow_good");
  const std::string bytes = from_hex(kGoodStream);
  write_bytes(dir / "data.arrow", std::vector<char>(bytes.begin(), bytes.end()));
  for (const auto& f : {ArrowStreamFile::open((dir / "data.arrow").string()),
                        ArrowStreamFile::from_bytes(bytes, "memory")}) {
    REQUIRE(f->num_rows() == 3);
    CHECK(f->num_batches() == 2);
    REQUIRE(f->num_columns() == 5);
    CHECK(f->column_name(0) == "text");
    CHECK(f->column_type(0) == "string");
    CHECK(f->column_type(1) == "list<int64>");
    CHECK(f->column_type(2) == "large_list<int64>");
    CHECK(f->column_type(3) == "int64");
    CHECK(f->column_type(4) == "list<int32>");
    const int ids = f->find_column("input_ids"), mask = f->find_column("loss_mask");
    CHECK(f->find_column("nope") == -1);
    CHECK(f->int_list(ids, 0) == Ints{5, 6, 7});
    CHECK(f->int_list(ids, 1) == Ints{8, 9});
    CHECK(f->int_list(ids, 2) == Ints{10, 11, 12, 13});  // the second record batch
    CHECK(f->int_list(mask, 0) == Ints{0, 1, 1});
    CHECK(f->int_list(mask, 2) == Ints{0, 0, 1, 1});
    CHECK(f->int_value(3, 1) == 2);
    CHECK(f->int_value(3, 2) == 4);
    CHECK(f->int_list(4, 1) == Ints{2, 3});
    CHECK(f->int_list(4, 2).empty());
    CHECK_THAT(error_of([&] { f->int_list(0, 0); }),
               Catch::Contains("'text' has type string, expected a list of integers"));
    CHECK_THAT(error_of([&] { f->int_value(1, 0); }), Catch::Contains("expected an integer"));
  }
}

TEST_CASE("arrow: a stream cut short anywhere is refused", "[arrow]") {
  const std::string bytes = from_hex(kGoodStream);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("cut to " << n << " of " << bytes.size() << " bytes");
    CHECK_THROWS_AS(ArrowStreamFile::from_bytes(bytes.substr(0, n), "cut"), ArrowFormatError);
  }
  CHECK_THAT(
      error_of([&] { ArrowStreamFile::from_bytes(bytes.substr(0, bytes.size() - 8), "cut"); }),
      Catch::Contains("without the end-of-stream marker"));
}

TEST_CASE("arrow: a metadata length past the end is refused", "[arrow]") {
  std::string bytes = from_hex(kGoodStream);
  bytes[4] = '\xff';
  bytes[5] = '\xff';
  bytes[6] = '\xff';
  bytes[7] = '\x0f';
  CHECK_THAT(error_of([&] { ArrowStreamFile::from_bytes(bytes, "long"); }),
             Catch::Contains("metadata length 268435455 runs past the end of the file"));
  bytes[7] = '\xff';  // negative
  CHECK_THROWS_AS(ArrowStreamFile::from_bytes(bytes, "negative"), ArrowFormatError);
}

TEST_CASE("arrow: a list offset past the values buffer is refused for that row only", "[arrow]") {
  const auto f = ArrowStreamFile::from_bytes(from_hex(kBadStream), "bad");
  CHECK(f->find_column("loss_mask") == -1);
  const int ids = f->find_column("input_ids");
  CHECK(f->int_list(ids, 0) == Ints{1, 2});
  CHECK_THAT(error_of([&] { f->int_list(ids, 1); }),
             Catch::Contains("bad row 1: column 'input_ids': list offsets [2, 9) outside its "
                             "values (3)"));
}

TEST_CASE("arrow: a compressed body is refused", "[arrow]") {
  CHECK_THAT(error_of([&] { ArrowStreamFile::from_bytes(from_hex(kCompressedStream), "lz4"); }),
             Catch::Contains("lz4: compressed record batches are not supported"));
}

TEST_CASE("arrow: any single flipped byte gives a value or an error, never a crash", "[arrow]") {
  const std::string good = from_hex(kGoodStream);
  int refused = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (const unsigned char x : {0xffu, 0x80u, 0x01u}) {
      std::string bytes = good;
      bytes[i] = static_cast<char>(static_cast<unsigned char>(bytes[i]) ^ x);
      try {
        read_everything(*ArrowStreamFile::from_bytes(bytes, "flipped"));
      } catch (const fsdp::UsageError&) {
        ++refused;
      }
    }
  }
  CHECK(refused > 0);
}
