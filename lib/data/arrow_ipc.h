// A minimal, bounded reader of Arrow IPC *stream* files (what Hugging Face `datasets`
// save_to_disk writes): the schema and record-batch metadata are parsed at open, and a row's
// values are read from the mmapped body only when asked for, so a 100k-row dataset is never
// decoded whole. Only integer and list-of-integer columns can be read; other columns are skipped
// by their buffer counts. Every flatbuffer offset, vtable, buffer range and list offset is
// checked against the bytes before it is used: hostile input gives ArrowFormatError, never an
// out-of-bounds read. Compressed bodies, big-endian data and unknown layouts are refused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace fsdp::data {

// The file is not a well-formed Arrow IPC stream, or uses a feature this reader does not have.
class ArrowFormatError : public UsageError {
 public:
  using UsageError::UsageError;
};

class ArrowStreamFile {
 public:
  // Maps `path` read-only and parses its metadata. Throws ArrowFormatError naming the file.
  static std::shared_ptr<ArrowStreamFile> open(const std::string& path);
  // The same over bytes in memory (tests); `where` names them in errors.
  static std::shared_ptr<ArrowStreamFile> from_bytes(std::string bytes, const std::string& where);
  ~ArrowStreamFile();
  ArrowStreamFile(const ArrowStreamFile&) = delete;
  ArrowStreamFile& operator=(const ArrowStreamFile&) = delete;

  const std::string& where() const { return where_; }
  int64_t num_rows() const { return num_rows_; }
  int64_t num_batches() const;
  int num_columns() const;
  const std::string& column_name(int c) const;
  // The column's type as Arrow prints it ("list<int64>", "int32", "string", ...).
  std::string column_type(int c) const;
  // Index of the top-level column `name`, or -1.
  int find_column(const std::string& name) const;

  // Row `row` (0 <= row < num_rows()) of a list<intN>/large_list<intN> column, widened to int64.
  // Throws ArrowFormatError for a null row or value, or offsets outside the child array, and
  // UsageError when the column has another type.
  std::vector<int64_t> int_list(int c, int64_t row) const;
  // Row `row` of an intN/uintN column (uint64 values must fit in int64).
  int64_t int_value(int c, int64_t row) const;

  struct Node;    // parsed schema field (arrow_ipc.cpp)
  struct Column;  // a top-level field and its first node/buffer index
  struct Batch;   // one record batch: rows, body position, nodes and buffers

 private:
  ArrowStreamFile();
  void parse();
  const Batch& batch_of(int64_t row, int64_t* local) const;

  std::string where_;
  std::string owned_;  // from_bytes storage
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  int64_t num_rows_ = 0;
  std::vector<Column> columns_;
  std::vector<Batch> batches_;
  std::vector<int64_t> batch_first_row_;
};

}  // namespace fsdp::data
