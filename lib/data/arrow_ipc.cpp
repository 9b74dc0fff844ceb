// Arrow IPC stream reading (arrow_ipc.h). The flatbuffer metadata is walked by hand with every
// position checked before it is loaded (no generated code, no trust in the writer); the body is
// only ever read through int_list/int_value, which check each buffer and offset they touch.
#include "data/arrow_ipc.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace fsdp::data {

namespace {

constexpr const char* kHint =
    "the Arrow file is damaged or was not written by Hugging Face datasets' save_to_disk; run "
    "the preprocessing that wrote it again";

// Type union tags of Schema.fbs.
enum TypeTag : uint8_t {
  kNull = 1,
  kInt = 2,
  kFloatingPoint = 3,
  kBinary = 4,
  kUtf8 = 5,
  kBool = 6,
  kDecimal = 7,
  kDate = 8,
  kTime = 9,
  kTimestamp = 10,
  kInterval = 11,
  kList = 12,
  kStruct = 13,
  kUnion = 14,
  kFixedSizeBinary = 15,
  kFixedSizeList = 16,
  kMap = 17,
  kDuration = 18,
  kLargeBinary = 19,
  kLargeUtf8 = 20,
  kLargeList = 21,
};
// MessageHeader union tags of Message.fbs.
constexpr uint8_t kSchemaMessage = 1, kDictionaryBatchMessage = 2, kRecordBatchMessage = 3;
// MetadataVersion V4: the oldest layout with the 8-byte-aligned buffers written since Arrow 0.8.
constexpr int16_t kMinMetadataVersion = 3;
constexpr int kMaxNesting = 32;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ArrowFormatError(where + ": " + what, kHint, __FILE__, __LINE__);
}

// A flatbuffer in [base, base + size): tables, vectors and strings located through checked
// offsets. uoffsets are unsigned and added, so following them always moves forward and cannot
// loop; nesting is bounded separately by the schema walk.
class FlatBuffer {
 public:
  struct Table {
    uint64_t pos = 0;
    uint64_t vtable = 0;
    uint16_t vtable_size = 0;
    uint16_t size = 0;
  };
  struct Vector {
    uint64_t pos = 0;  // first element
    uint32_t count = 0;
  };

  FlatBuffer(const uint8_t* base, uint64_t size, std::string where)
      : base_(base), size_(size), where_(std::move(where)) {}

  void need(uint64_t pos, uint64_t n) const {
    if (pos > size_ || n > size_ - pos)
      fail(where_, str("flatbuffer reference to bytes [", pos, ", ", pos + n,
                       ") outside the metadata (", size_, " bytes)"));
  }
  template <typename T>
  T load(uint64_t pos) const {
    need(pos, sizeof(T));
    T v;
    std::memcpy(&v, base_ + pos, sizeof(T));
    return v;
  }

  Table root() const { return table(load<uint32_t>(0)); }

  Table table(uint64_t pos) const {
    Table t;
    t.pos = pos;
    const int64_t vt = static_cast<int64_t>(pos) - load<int32_t>(pos);
    if (vt < 0 || static_cast<uint64_t>(vt) > size_) fail(where_, "flatbuffer vtable out of range");
    t.vtable = static_cast<uint64_t>(vt);
    t.vtable_size = load<uint16_t>(t.vtable);
    t.size = load<uint16_t>(t.vtable + 2);
    if (t.vtable_size < 4 || t.vtable_size % 2 != 0 || t.size < 4)
      fail(where_, "malformed flatbuffer vtable");
    need(t.vtable, t.vtable_size);
    need(t.pos, t.size);
    return t;
  }

  // Offset of field `f` inside its table, 0 when absent.
  uint16_t slot(const Table& t, int f) const {
    const uint64_t s = 4 + 2 * static_cast<uint64_t>(f);
    return s + 2 > t.vtable_size ? 0 : load<uint16_t>(t.vtable + s);
  }
  bool has(const Table& t, int f) const { return slot(t, f) != 0; }

  template <typename T>
  T scalar(const Table& t, int f, T fallback) const {
    const uint16_t o = slot(t, f);
    if (o == 0) return fallback;
    if (o + sizeof(T) > t.size) fail(where_, "flatbuffer field outside its table");
    return load<T>(t.pos + o);
  }

  // Position of the object that offset field `f` points to.
  bool ref(const Table& t, int f, uint64_t* out) const {
    const uint16_t o = slot(t, f);
    if (o == 0) return false;
    if (o + 4u > t.size) fail(where_, "flatbuffer field outside its table");
    *out = t.pos + o + load<uint32_t>(t.pos + o);
    return true;
  }
  bool subtable(const Table& t, int f, Table* out) const {
    uint64_t p = 0;
    if (!ref(t, f, &p)) return false;
    *out = table(p);
    return true;
  }
  Vector vector(const Table& t, int f, uint64_t element_size) const {
    uint64_t p = 0;
    if (!ref(t, f, &p)) return {};
    const uint32_t n = load<uint32_t>(p);
    need(p + 4, static_cast<uint64_t>(n) * element_size);
    return {p + 4, n};
  }
  Table element_table(const Vector& v, uint32_t i) const {
    const uint64_t e = v.pos + 4 * static_cast<uint64_t>(i);
    return table(e + load<uint32_t>(e));
  }
  std::string string(const Table& t, int f) const {
    const Vector v = vector(t, f, 1);
    return std::string(reinterpret_cast<const char*>(base_ + v.pos), v.count);
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  std::string where_;
};

}  // namespace

struct ArrowStreamFile::Node {
  std::string name;
  uint8_t type = 0;
  int bit_width = 0;  // Int only
  bool is_signed = false;
  bool dictionary = false;
  std::vector<Node> children;
};

struct ArrowStreamFile::Column {
  Node node;
  size_t first_node = 0;
  size_t first_buffer = 0;
};

struct ArrowStreamFile::Batch {
  struct FieldNode {
    int64_t length = 0;
    int64_t null_count = 0;
  };
  struct Buffer {
    uint64_t offset = 0;  // absolute file offset
    uint64_t length = 0;
  };
  int64_t length = 0;
  std::vector<FieldNode> nodes;
  std::vector<Buffer> buffers;
};

namespace {

using Node = ArrowStreamFile::Node;

Node parse_field(const FlatBuffer& fb, const FlatBuffer::Table& t, int depth,
                 const std::string& where) {
  if (depth > kMaxNesting) fail(where, str("schema nested deeper than ", kMaxNesting, " levels"));
  Node n;
  n.name = fb.string(t, 0);
  n.type = fb.scalar<uint8_t>(t, 2, 0);
  n.dictionary = fb.has(t, 4);
  FlatBuffer::Table type;
  if (n.type == kInt) {
    if (!fb.subtable(t, 3, &type)) fail(where, "column '" + n.name + "': Int type without details");
    n.bit_width = fb.scalar<int32_t>(type, 0, 0);
    n.is_signed = fb.scalar<uint8_t>(type, 1, 0) != 0;
    if (n.bit_width != 8 && n.bit_width != 16 && n.bit_width != 32 && n.bit_width != 64)
      fail(where, str("column '", n.name, "': integer bit width ", n.bit_width));
  }
  const FlatBuffer::Vector children = fb.vector(t, 5, 4);
  for (uint32_t i = 0; i < children.count; ++i)
    n.children.push_back(parse_field(fb, fb.element_table(children, i), depth + 1, where));
  return n;
}

std::string type_name(const Node& n) {
  std::string inner;
  for (const auto& c : n.children) inner += (inner.empty() ? "" : ", ") + type_name(c);
  std::string s;
  switch (n.type) {
    case kNull:
      s = "null";
      break;
    case kInt:
      s = str(n.is_signed ? "int" : "uint", n.bit_width);
      break;
    case kFloatingPoint:
      s = "float";
      break;
    case kBinary:
      s = "binary";
      break;
    case kUtf8:
      s = "string";
      break;
    case kBool:
      s = "bool";
      break;
    case kDecimal:
      s = "decimal";
      break;
    case kDate:
      s = "date";
      break;
    case kTime:
      s = "time";
      break;
    case kTimestamp:
      s = "timestamp";
      break;
    case kInterval:
      s = "interval";
      break;
    case kList:
      s = "list<" + inner + ">";
      break;
    case kStruct:
      s = "struct<" + inner + ">";
      break;
    case kUnion:
      s = "union";
      break;
    case kFixedSizeBinary:
      s = "fixed_size_binary";
      break;
    case kFixedSizeList:
      s = "fixed_size_list<" + inner + ">";
      break;
    case kMap:
      s = "map";
      break;
    case kDuration:
      s = "duration";
      break;
    case kLargeBinary:
      s = "large_binary";
      break;
    case kLargeUtf8:
      s = "large_string";
      break;
    case kLargeList:
      s = "large_list<" + inner + ">";
      break;
    default:
      s = str("type #", int(n.type));
      break;
  }
  return n.dictionary ? "dictionary<" + s + ">" : s;
}

// Nodes and buffers one field occupies in a record batch (pre-order, as the IPC format lays
// them out), so that columns nobody reads can be stepped over.
void count_layout(const Node& n, const std::string& where, size_t* nodes, size_t* buffers) {
  *nodes += 1;
  if (n.dictionary) {  // the batch holds only the integer indices
    *buffers += 2;
    return;
  }
  size_t own = 0, want_children = SIZE_MAX;
  switch (n.type) {
    case kNull:
      own = 0;
      want_children = 0;
      break;
    case kInt:
    case kFloatingPoint:
    case kBool:
    case kDecimal:
    case kDate:
    case kTime:
    case kTimestamp:
    case kInterval:
    case kFixedSizeBinary:
    case kDuration:
      own = 2;
      want_children = 0;
      break;
    case kBinary:
    case kUtf8:
    case kLargeBinary:
    case kLargeUtf8:
      own = 3;
      want_children = 0;
      break;
    case kList:
    case kLargeList:
    case kMap:
      own = 2;
      want_children = 1;
      break;
    case kFixedSizeList:
      own = 1;
      want_children = 1;
      break;
    case kStruct:
      own = 1;
      break;
    default:
      fail(where, str("column '", n.name, "' has type ", type_name(n),
                      ", whose layout this reader does not know"));
  }
  if (want_children != SIZE_MAX && n.children.size() != want_children)
    fail(where, str("column '", n.name, "' of type ", type_name(n), " has ", n.children.size(),
                    " child fields"));
  *buffers += own;
  for (const auto& c : n.children) count_layout(c, where, nodes, buffers);
}

}  // namespace

ArrowStreamFile::ArrowStreamFile() = default;

ArrowStreamFile::~ArrowStreamFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<ArrowStreamFile> ArrowStreamFile::open(const std::string& path) {
  std::shared_ptr<ArrowStreamFile> f(new ArrowStreamFile());
  f->where_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_USAGE_CHECK(f->fd_ >= 0, str(path, ": cannot open (", std::strerror(errno), ")"),
                   "check the path and its permissions");
  struct stat st {};
  FSDP_USAGE_CHECK(::fstat(f->fd_, &st) == 0,
                   str(path, ": cannot stat (", std::strerror(errno), ")"),
                   "check the path and its permissions");
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, f->fd_, 0);
    FSDP_USAGE_CHECK(p != MAP_FAILED, str(path, ": cannot mmap (", std::strerror(errno), ")"),
                     "check the file system and the address-space limit (ulimit -v)");
    f->base_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  }
  f->parse();
  return f;
}

std::shared_ptr<ArrowStreamFile> ArrowStreamFile::from_bytes(std::string bytes,
                                                             const std::string& where) {
  std::shared_ptr<ArrowStreamFile> f(new ArrowStreamFile());
  f->where_ = where;
  f->owned_ = std::move(bytes);
  f->base_ = reinterpret_cast<const uint8_t*>(f->owned_.data());
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

void ArrowStreamFile::parse() {
  const FlatBuffer file(base_, size_, where_);
  size_t total_nodes = 0, total_buffers = 0;
  bool have_schema = false;
  uint64_t p = 0;
  for (;;) {
    const uint64_t start = p;
    if (p == size_)
      fail(where_, str("ends at byte ", p, " without the end-of-stream marker (truncated?)"));
    if (size_ - p < 4) fail(where_, str("truncated message prefix at byte ", p));
    const uint32_t word = file.load<uint32_t>(p);
    int64_t len = 0;
    if (word == 0xFFFFFFFFu) {  // continuation marker of format >= 0.15
      if (size_ - p < 8) fail(where_, str("truncated message prefix at byte ", p));
      len = file.load<int32_t>(p + 4);
      p += 8;
    } else {  // the pre-0.15 prefix: the length alone
      len = static_cast<int32_t>(word);
      p += 4;
    }
    if (len == 0) break;  // end of stream
    if (len < 0 || static_cast<uint64_t>(len) > size_ - p)
      fail(where_, str("message at byte ", start, ": metadata length ", len,
                       " runs past the end of the file (", size_, " bytes)"));
    const FlatBuffer fb(base_ + p, static_cast<uint64_t>(len),
                        str(where_, " (message at byte ", start, ")"));
    const FlatBuffer::Table msg = fb.root();
    const int16_t version = fb.scalar<int16_t>(msg, 0, 0);
    if (version < kMinMetadataVersion)
      fail(where_, str("metadata version V", version + 1, " is older than V4"));
    const uint8_t kind = fb.scalar<uint8_t>(msg, 1, 0);
    FlatBuffer::Table header;
    if (!fb.subtable(msg, 2, &header))
      fail(where_, str("message at byte ", start, " has no header"));
    const int64_t body_length = fb.scalar<int64_t>(msg, 3, 0);
    const uint64_t body = p + static_cast<uint64_t>(len);
    if (body_length < 0 || static_cast<uint64_t>(body_length) > size_ - body)
      fail(where_, str("message at byte ", start, ": body of ", body_length,
                       " bytes runs past the end of the file (", size_, " bytes)"));
    if (kind == kSchemaMessage) {
      if (have_schema) fail(where_, "a second schema message");
      have_schema = true;
      if (fb.scalar<int16_t>(header, 0, 0) != 0) fail(where_, "big-endian data is not supported");
      const FlatBuffer::Vector fields = fb.vector(header, 1, 4);
      for (uint32_t i = 0; i < fields.count; ++i) {
        Column c;
        c.node = parse_field(fb, fb.element_table(fields, i), 0, where_);
        c.first_node = total_nodes;
        c.first_buffer = total_buffers;
        count_layout(c.node, where_, &total_nodes, &total_buffers);
        columns_.push_back(std::move(c));
      }
    } else if (kind == kRecordBatchMessage) {
      if (!have_schema) fail(where_, "record batch before the schema");
      Batch b;
      b.length = fb.scalar<int64_t>(header, 0, 0);
      if (b.length < 0) fail(where_, str("record batch of ", b.length, " rows"));
      if (fb.has(header, 3))
        fail(where_, "compressed record batches are not supported (save the dataset uncompressed)");
      const FlatBuffer::Vector nodes = fb.vector(header, 1, 16);
      const FlatBuffer::Vector buffers = fb.vector(header, 2, 16);
      if (nodes.count != total_nodes || buffers.count != total_buffers)
        fail(where_,
             str("record batch at byte ", start, " has ", nodes.count, " nodes and ", buffers.count,
                 " buffers, the schema needs ", total_nodes, " and ", total_buffers));
      for (uint32_t i = 0; i < nodes.count; ++i) {
        Batch::FieldNode n{fb.load<int64_t>(nodes.pos + 16 * uint64_t{i}),
                           fb.load<int64_t>(nodes.pos + 16 * uint64_t{i} + 8)};
        if (n.length < 0 || n.null_count < 0 || n.null_count > n.length)
          fail(where_, str("record batch at byte ", start, ": field node ", i, " has length ",
                           n.length, " and null count ", n.null_count));
        b.nodes.push_back(n);
      }
      for (uint32_t i = 0; i < buffers.count; ++i) {
        const int64_t off = fb.load<int64_t>(buffers.pos + 16 * uint64_t{i});
        const int64_t n = fb.load<int64_t>(buffers.pos + 16 * uint64_t{i} + 8);
        if (off < 0 || n < 0 || static_cast<uint64_t>(off) > static_cast<uint64_t>(body_length) ||
            static_cast<uint64_t>(n) > static_cast<uint64_t>(body_length - off))
          fail(where_, str("record batch at byte ", start, ": buffer ", i, " [", off, ", +", n,
                           ") outside the body of ", body_length, " bytes"));
        b.buffers.push_back({body + static_cast<uint64_t>(off), static_cast<uint64_t>(n)});
      }
      for (const auto& c : columns_)
        if (b.nodes[c.first_node].length != b.length)
          fail(where_, str("record batch at byte ", start, ": column '", c.node.name, "' has ",
                           b.nodes[c.first_node].length, " rows, the batch ", b.length));
      if (b.length > std::numeric_limits<int64_t>::max() - num_rows_)
        fail(where_, "more rows than int64 can count");
      batch_first_row_.push_back(num_rows_);
      num_rows_ += b.length;
      batches_.push_back(std::move(b));
    } else if (kind != kDictionaryBatchMessage) {
      // Dictionary batches only feed dictionary-encoded columns, which are never read here.
      fail(where_, str("message at byte ", start, " has unsupported type ", int(kind)));
    }
    p = body + static_cast<uint64_t>(body_length);
  }
  if (!have_schema) fail(where_, "no schema message");
}

int64_t ArrowStreamFile::num_batches() const {
  return static_cast<int64_t>(batches_.size());
}
int ArrowStreamFile::num_columns() const {
  return static_cast<int>(columns_.size());
}

const std::string& ArrowStreamFile::column_name(int c) const {
  FSDP_CHECK(c >= 0 && c < num_columns(), str("column ", c, " out of range"),
             "this is a bug in fsdp-train: please report it");
  return columns_[c].node.name;
}

std::string ArrowStreamFile::column_type(int c) const {
  column_name(c);
  return type_name(columns_[c].node);
}

int ArrowStreamFile::find_column(const std::string& name) const {
  for (size_t i = 0; i < columns_.size(); ++i)
    if (columns_[i].node.name == name) return static_cast<int>(i);
  return -1;
}

const ArrowStreamFile::Batch& ArrowStreamFile::batch_of(int64_t row, int64_t* local) const {
  FSDP_CHECK(row >= 0 && row < num_rows_,
             str(where_, ": row ", row, " out of range [0, ", num_rows_, ")"),
             "this is a bug in fsdp-train: please report it");
  const auto it = std::upper_bound(batch_first_row_.begin(), batch_first_row_.end(), row) - 1;
  const size_t k = static_cast<size_t>(it - batch_first_row_.begin());
  *local = row - *it;
  return batches_[k];
}

namespace {

using Batch = ArrowStreamFile::Batch;

// Whether slot `i` of an array with `null_count` nulls is valid, reading its validity bitmap.
bool is_valid(const uint8_t* base, const Batch::Buffer& bitmap, int64_t null_count, int64_t i,
              const std::string& where) {
  if (null_count == 0) return true;
  const uint64_t byte = static_cast<uint64_t>(i) / 8;
  if (byte >= bitmap.length)
    fail(where, str("validity bitmap of ", bitmap.length, " bytes too short for slot ", i));
  return (base[bitmap.offset + byte] >> (i % 8)) & 1;
}

// Value i of an integer array's data buffer, widened to int64.
int64_t load_int(const uint8_t* base, const Batch::Buffer& data, const Node& n, int64_t i,
                 const std::string& where) {
  const uint64_t w = static_cast<uint64_t>(n.bit_width) / 8;
  if (static_cast<uint64_t>(i) >= data.length / w)
    fail(where, str("column '", n.name, "': value ", i, " past its data buffer of ", data.length,
                    " bytes"));
  const uint8_t* p = base + data.offset + static_cast<uint64_t>(i) * w;
  switch (n.bit_width) {
    case 8:
      return n.is_signed ? int64_t{static_cast<int8_t>(*p)} : int64_t{*p};
    case 16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return n.is_signed ? int64_t{static_cast<int16_t>(v)} : int64_t{v};
    }
    case 32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return n.is_signed ? int64_t{static_cast<int32_t>(v)} : int64_t{v};
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      if (!n.is_signed && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(where, str("column '", n.name, "': uint64 value ", v, " does not fit in int64"));
      return static_cast<int64_t>(v);
    }
  }
}

}  // namespace

std::vector<int64_t> ArrowStreamFile::int_list(int c, int64_t row) const {
  const Column& col = columns_.at(static_cast<size_t>(c));
  const Node& n = col.node;
  FSDP_USAGE_CHECK(!n.dictionary && (n.type == kList || n.type == kLargeList) &&
                       n.children.size() == 1 && n.children[0].type == kInt &&
                       !n.children[0].dictionary,
                   str(where_, ": column '", n.name, "' has type ", type_name(n),
                       ", expected a list of integers"),
                   "point the reader at the preprocessed dataset the hidden states were made from");
  int64_t r = 0;
  const Batch& b = batch_of(row, &r);
  const Batch::FieldNode& parent = b.nodes[col.first_node];
  const Batch::FieldNode& child = b.nodes[col.first_node + 1];
  const Batch::Buffer& validity = b.buffers[col.first_buffer];
  const Batch::Buffer& offsets = b.buffers[col.first_buffer + 1];
  const Batch::Buffer& child_validity = b.buffers[col.first_buffer + 2];
  const Batch::Buffer& child_data = b.buffers[col.first_buffer + 3];
  const std::string where = str(where_, " row ", row);
  if (!is_valid(base_, validity, parent.null_count, r, where))
    fail(where, str("column '", n.name, "' is null"));
  const uint64_t ow = n.type == kLargeList ? 8 : 4;
  if (static_cast<uint64_t>(r) + 2 > offsets.length / ow)
    fail(where, str("column '", n.name, "': offsets buffer of ", offsets.length,
                    " bytes too short for row ", r, " of its batch"));
  const uint8_t* op = base_ + offsets.offset + static_cast<uint64_t>(r) * ow;
  int64_t begin = 0, end = 0;
  if (ow == 4) {
    int32_t v[2];
    std::memcpy(v, op, 8);
    begin = v[0];
    end = v[1];
  } else {
    std::memcpy(&begin, op, 8);
    std::memcpy(&end, op + 8, 8);
  }
  if (begin < 0 || end < begin || end > child.length)
    fail(where, str("column '", n.name, "': list offsets [", begin, ", ", end,
                    ") outside its values (", child.length, ")"));
  if (static_cast<uint64_t>(end) > child_data.length / (uint64_t(n.children[0].bit_width) / 8))
    fail(where, fsdp::str("column '", n.name, "': list offsets [", begin, ", ", end,
                          ") past its data buffer of ", child_data.length, " bytes"));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) {
    if (!is_valid(base_, child_validity, child.null_count, i, where))
      fail(where, str("column '", n.name, "' holds a null value"));
    out.push_back(load_int(base_, child_data, n.children[0], i, where));
  }
  return out;
}

int64_t ArrowStreamFile::int_value(int c, int64_t row) const {
  const Column& col = columns_.at(static_cast<size_t>(c));
  const Node& n = col.node;
  FSDP_USAGE_CHECK(
      !n.dictionary && n.type == kInt,
      str(where_, ": column '", n.name, "' has type ", type_name(n), ", expected an integer"),
      "point the reader at the preprocessed dataset the hidden states were made from");
  int64_t r = 0;
  const Batch& b = batch_of(row, &r);
  const std::string where = str(where_, " row ", row);
  if (!is_valid(base_, b.buffers[col.first_buffer], b.nodes[col.first_node].null_count, r, where))
    fail(where, str("column '", n.name, "' is null"));
  return load_int(base_, b.buffers[col.first_buffer + 1], n, r, where);
}

}  // namespace fsdp::data
