// Restricted, bounded unpickler (core/pickle_reader.h). Opcode meanings: Python's
// Lib/pickletools.py documentation of protocols 0-5.
#include "core/pickle_reader.h"
#include "core/error.h"  // fsdp::str (header-only)

#include <cstring>
#include <unordered_map>

namespace fsdp {

namespace {

using Kind = PickleNode::Kind;

// Storage classes torch.save names, by their dtype.
const char* storage_dtype(const std::string& global) {
  static const std::pair<const char*, const char*> kTable[] = {
      {"torch.FloatStorage", "float"}, {"torch.DoubleStorage", "double"},
      {"torch.HalfStorage", "half"},   {"torch.BFloat16Storage", "bfloat16"},
      {"torch.LongStorage", "int64"},  {"torch.IntStorage", "int32"},
      {"torch.ShortStorage", "int16"}, {"torch.CharStorage", "int8"},
      {"torch.ByteStorage", "uint8"},  {"torch.BoolStorage", "bool"}};
  for (const auto& [name, dtype] : kTable)
    if (global == name) return dtype;
  return nullptr;
}

const char* const kCallables[] = {"torch._utils._rebuild_tensor_v2",
                                  "torch._utils._rebuild_parameter", "collections.OrderedDict",
                                  "torch.jit._pickle.restore_type_tag"};

class Unpickler {
 public:
  Unpickler(const char* data, uint64_t size, const PickleLimits& limits)
      : p_(data), size_(size), limits_(limits) {}

  PickleTree run() {
    if (size_ > limits_.max_bytes)
      throw FormatError(
          str("pickle of ", size_, " bytes exceeds the limit of ", limits_.max_bytes));
    while (true) {
      op_at_ = pos_;
      const unsigned char op = u8();
      switch (op) {
        case 0x80:
          u8();
          break;  // PROTO
        case 0x95:
          take(8);
          break;     // FRAME: length only, data follows inline
        case '.': {  // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail("STOP with a stack of ", stack_.size());
          tree_.root = stack_.back();
          return std::move(tree_);
        }
        case '(':
          marks_.push_back(stack_.size());
          break;  // MARK
        case '0':
          pop();
          break;  // POP
        case '1':
          pop_mark();
          break;  // POP_MARK
        case '2':
          push(top());
          break;  // DUP
        case 'N':
          push(make(Kind::kNone));
          break;
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          const uint32_t n = make(Kind::kBool);
          tree_.nodes[n].i = op == 0x88;
          push(n);
          break;
        }
        case 'K':
          push_int(u8());
          break;  // BININT1
        case 'M':
          push_int(static_cast<int64_t>(le(2)));
          break;  // BININT2
        case 'J':
          push_int(static_cast<int32_t>(le(4)));
          break;      // BININT
        case 0x8a: {  // LONG1
          const unsigned n = u8();
          if (n > 8) fail("LONG1 of ", n, " bytes (integers above 64 bits are not read)");
          uint64_t v = le(n);
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
          push_int(static_cast<int64_t>(v));
          break;
        }
        case 'G': {  // BINFLOAT (big-endian)
          const char* b = take(8);
          uint64_t v = 0;
          for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(b[i]);
          double d;
          std::memcpy(&d, &v, 8);
          const uint32_t n = make(Kind::kFloat);
          tree_.nodes[n].f = d;
          push(n);
          break;
        }
        case 'X':
          push_string(le(4));
          break;  // BINUNICODE
        case 0x8c:
          push_string(u8());
          break;  // SHORT_BINUNICODE
        case 0x8d:
          push_string(le(8));
          break;  // BINUNICODE8
        case ']':
          push(make(Kind::kList));
          break;  // EMPTY_LIST
        case '}':
          push(make(Kind::kDict));
          break;  // EMPTY_DICT
        case ')':
          push(make(Kind::kTuple));
          break;  // EMPTY_TUPLE
        case 'l': {
          auto items = pop_mark();
          push(container(Kind::kList, items));
          break;
        }
        case 't': {
          auto items = pop_mark();
          push(container(Kind::kTuple, items));
          break;
        }
        case 'd': {
          auto items = pop_mark();
          if (items.size() % 2) fail("DICT with an odd number of items");
          push(container(Kind::kDict, items));
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          const size_t n = op - 0x84;
          if (stack_.size() < n + floor()) fail("TUPLE", n, " on a stack of ", stack_.size());
          std::vector<uint32_t> items(stack_.end() - n, stack_.end());
          stack_.resize(stack_.size() - n);
          push(container(Kind::kTuple, items));
          break;
        }
        case 'a': {
          const uint32_t v = pop();
          add_to(top(), Kind::kList, {v});
          break;
        }  // APPEND
        case 'e': {
          auto items = pop_mark();
          add_to(top(), Kind::kList, items);
          break;
        }            // APPENDS
        case 's': {  // SETITEM
          const uint32_t v = pop(), k = pop();
          add_to(top(), Kind::kDict, {k, v});
          break;
        }
        case 'u': {  // SETITEMS
          auto items = pop_mark();
          if (items.size() % 2) fail("SETITEMS with an odd number of items");
          add_to(top(), Kind::kDict, items);
          break;
        }
        case 'q':
          memo_put(u8());
          break;  // BINPUT
        case 'r':
          memo_put(le(4));
          break;  // LONG_BINPUT
        case 0x94:
          memo_put(memo_.size());
          break;  // MEMOIZE
        case 'h':
          memo_get(u8());
          break;  // BINGET
        case 'j':
          memo_get(le(4));
          break;     // LONG_BINGET
        case 'c': {  // GLOBAL "module\nname\n"
          std::string module = line(), name = line();
          push(global(module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const uint32_t name = pop(), module = pop();
          if (node(name).kind != Kind::kString || node(module).kind != Kind::kString)
            fail("STACK_GLOBAL needs two strings");
          push(global(node(module).s + "." + node(name).s));
          break;
        }
        case 'R':
          reduce();
          break;  // REDUCE
        case 'Q':
          persistent_load();
          break;     // BINPERSID
        case 'b': {  // BUILD: only an empty state (OrderedDict)
          const uint32_t state = pop();
          const PickleNode& s = node(state);
          if (!(s.kind == Kind::kNone || (s.kind == Kind::kDict && s.items.empty())))
            fail("BUILD with a state (object attributes are not read)");
          top();
          break;
        }
        default:
          fail("unsupported pickle opcode 0x", std::hex, static_cast<int>(op));
      }
    }
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw FormatError(str("pickle offset ", op_at_, ": ", args...));
  }

  const char* take(uint64_t n) {
    if (n > size_ - pos_) fail("needs ", n, " bytes, ", size_ - pos_, " left (truncated)");
    const char* r = p_ + pos_;
    pos_ += n;
    return r;
  }
  unsigned u8() { return static_cast<unsigned char>(*take(1)); }
  uint64_t le(unsigned n) {
    const char* b = take(n);
    uint64_t v = 0;
    for (int i = static_cast<int>(n) - 1; i >= 0; --i)
      v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
  }
  std::string line() {
    std::string s;
    while (true) {
      const char c = *take(1);
      if (c == '\n') return s;
      if (s.size() >= 256) fail("GLOBAL name longer than 256 bytes");
      s.push_back(c);
    }
  }

  PickleNode& node(uint32_t i) { return tree_.nodes[i]; }
  uint32_t make(Kind k) {
    if (tree_.nodes.size() >= limits_.max_objects)
      fail("more than ", limits_.max_objects, " objects (limit)");
    tree_.nodes.emplace_back();
    tree_.nodes.back().kind = k;
    return static_cast<uint32_t>(tree_.nodes.size() - 1);
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(uint32_t n) {
    if (stack_.size() >= limits_.max_objects) fail("stack deeper than ", limits_.max_objects);
    stack_.push_back(n);
  }
  uint32_t pop() {
    if (stack_.size() <= floor()) fail("pop from an empty stack");
    const uint32_t n = stack_.back();
    stack_.pop_back();
    return n;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) fail("empty stack");
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void push_int(int64_t v) {
    const uint32_t n = make(Kind::kInt);
    node(n).i = v;
    push(n);
  }
  void push_string(uint64_t len) {
    if (len > limits_.max_string)
      fail("string of ", len, " bytes exceeds the limit of ", limits_.max_string);
    const char* b = take(len);
    const uint32_t n = make(Kind::kString);
    node(n).s.assign(b, len);
    push(n);
  }
  // Depth of a container holding `items`, refused past the limit (a million nested lists).
  uint32_t depth_with(uint32_t depth, const std::vector<uint32_t>& items) {
    for (uint32_t i : items) depth = std::max(depth, node(i).depth + 1);
    if (depth > limits_.max_depth) fail("nesting deeper than ", limits_.max_depth, " (limit)");
    return depth;
  }
  uint32_t container(Kind k, const std::vector<uint32_t>& items) {
    const uint32_t d = depth_with(0, items);
    const uint32_t n = make(k);
    node(n).items = items;
    node(n).depth = d;
    return n;
  }
  void add_to(uint32_t target, Kind want, const std::vector<uint32_t>& items) {
    if (node(target).kind != want)
      fail(want == Kind::kList ? "APPEND" : "SETITEM", " on a value that is not a ",
           want == Kind::kList ? "list" : "dict");
    const uint32_t d = depth_with(node(target).depth, items);
    if (node(target).items.size() + items.size() > limits_.max_objects)
      fail("container with more than ", limits_.max_objects, " items");
    node(target).depth = d;
    node(target).items.insert(node(target).items.end(), items.begin(), items.end());
  }
  void memo_put(uint64_t key) {
    if (memo_.size() >= limits_.max_memo && !memo_.count(key))
      fail("memo with more than ", limits_.max_memo, " entries (limit)");
    memo_[key] = top();
  }
  void memo_get(uint64_t key) {
    const auto it = memo_.find(key);
    if (it == memo_.end()) fail("memo key ", key, " was never stored");
    push(it->second);
  }
  uint32_t global(const std::string& name) {
    bool ok = storage_dtype(name) != nullptr;
    for (const char* c : kCallables) ok = ok || name == c;
    if (!ok)
      fail("refers to the global '", name,
           "', which is not allowed (only tensors, storages and containers are read; nothing is "
           "executed)");
    const uint32_t n = make(Kind::kGlobal);
    node(n).s = name;
    return n;
  }
  const PickleNode& tuple_arg(uint32_t t, size_t min_len, size_t max_len, const char* what) {
    const PickleNode& a = node(t);
    if (a.kind != Kind::kTuple || a.items.size() < min_len || a.items.size() > max_len)
      fail(what, ": arguments are not a tuple of ", min_len, "..", max_len, " values");
    return a;
  }
  int64_t int_of(uint32_t i, const char* what) {
    if (node(i).kind != Kind::kInt) fail(what, " is not an integer");
    return node(i).i;
  }
  std::vector<int64_t> ints_of(uint32_t t, const char* what) {
    const PickleNode& a = node(t);
    if (a.kind != Kind::kTuple && a.kind != Kind::kList) fail(what, " is not a tuple");
    if (a.items.size() > limits_.max_dims)
      fail(what, " has ", a.items.size(), " dimensions (limit ", limits_.max_dims, ")");
    std::vector<int64_t> v;
    for (uint32_t i : a.items) v.push_back(int_of(i, what));
    return v;
  }
  void reduce() {
    const uint32_t args = pop(), fn = pop();
    if (node(fn).kind != Kind::kGlobal) fail("REDUCE of a value that is not an allowed global");
    const std::string name = node(fn).s;
    if (name == "collections.OrderedDict") {
      tuple_arg(args, 0, 0, name.c_str());
      push(make(Kind::kDict));
    } else if (name == "torch.jit._pickle.restore_type_tag") {
      const PickleNode& a = tuple_arg(args, 2, 2, name.c_str());
      push(a.items[0]);
    } else if (name == "torch._utils._rebuild_parameter") {
      const PickleNode& a = tuple_arg(args, 3, 3, name.c_str());
      if (node(a.items[0]).kind != Kind::kTensor) fail(name, ": first argument is not a tensor");
      push(a.items[0]);
    } else if (name == "torch._utils._rebuild_tensor_v2") {
      const std::vector<uint32_t> a = tuple_arg(args, 6, 7, name.c_str()).items;
      if (node(a[0]).kind != Kind::kStorage) fail(name, ": first argument is not a storage");
      const int64_t offset = int_of(a[1], "storage offset");
      std::vector<int64_t> sizes = ints_of(a[2], "size"), strides = ints_of(a[3], "stride");
      if (sizes.size() != strides.size())
        fail("tensor with ", sizes.size(), " sizes but ", strides.size(), " strides");
      const uint32_t n = make(Kind::kTensor);
      node(n).i = offset;
      node(n).dtype = node(a[0]).dtype;
      node(n).items = {a[0]};
      node(n).sizes = std::move(sizes);
      node(n).strides = std::move(strides);
      push(n);
    } else {
      fail("REDUCE of '", name, "' (only tensor rebuilding and OrderedDict are called)");
    }
  }
  void persistent_load() {
    const uint32_t pid = pop();
    const PickleNode& t = node(pid);
    if (t.kind != Kind::kTuple || t.items.size() != 5 || node(t.items[0]).kind != Kind::kString ||
        node(t.items[0]).s != "storage")
      fail("persistent id is not ('storage', type, key, location, size)");
    const PickleNode& type = node(t.items[1]);
    const char* dtype = type.kind == Kind::kGlobal ? storage_dtype(type.s) : nullptr;
    if (!dtype) fail("persistent id names no known storage type");
    if (node(t.items[2]).kind != Kind::kString) fail("storage key is not a string");
    if (node(t.items[3]).kind != Kind::kString) fail("storage location is not a string");
    const int64_t numel = int_of(t.items[4], "storage size");
    if (numel < 0) fail("storage of ", numel, " elements");
    const std::string key = node(t.items[2]).s;
    if (const auto it = storages_.find(key); it != storages_.end()) {
      const PickleNode& old = node(it->second);
      if (old.dtype != dtype || old.i != numel)
        fail("storage '", key, "' declared twice differently");
      push(it->second);
      return;
    }
    const uint32_t n = make(Kind::kStorage);
    node(n).s = key;
    node(n).dtype = dtype;
    node(n).i = numel;
    storages_[key] = n;
    push(n);
  }

  const char* p_;
  uint64_t size_;
  uint64_t pos_ = 0, op_at_ = 0;
  PickleLimits limits_;
  PickleTree tree_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::unordered_map<std::string, uint32_t> storages_;
};

}  // namespace

PickleTree read_pickle(const char* data, uint64_t size, const PickleLimits& limits) {
  return Unpickler(data, size, limits).run();
}

int dtype_element_size(const std::string& d) {
  if (d == "double" || d == "int64") return 8;
  if (d == "float" || d == "int32") return 4;
  if (d == "half" || d == "bfloat16" || d == "int16") return 2;
  if (d == "int8" || d == "uint8" || d == "bool") return 1;
  return 0;
}

}  // namespace fsdp
