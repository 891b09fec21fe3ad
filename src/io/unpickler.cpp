// Restricted state-dict unpickler (see unpickler.h). Opcode semantics follow CPython's
// Lib/pickle.py (_Unpickler) for the subset implemented; everything else is refused.
#include "io/unpickler.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "fdpp/error.h"
#include "io/safetensors.h"

namespace fdpp::torch_pickle {

using hf::shown;

bool TensorRecord::contiguous() const {
  if (n_elements == 0) return true;  // (and its sizes may multiply past 2^63 before the 0)
  uint64_t expected = 1;              // <= n_elements, which fits
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && static_cast<uint64_t>(strides[i]) != expected) return false;
    expected *= static_cast<uint64_t>(shape[i]);
  }
  return true;
}

uint64_t TensorRecord::extent() const {
  if (n_elements == 0) return 0;
  uint64_t e = 1;
  for (size_t i = 0; i < shape.size(); ++i)
    e += static_cast<uint64_t>(shape[i] - 1) * static_cast<uint64_t>(strides[i]);  // bounded by the parser
  return e;
}

namespace {

// Pickle opcodes (CPython Lib/pickle.py).
enum Op : uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', FLOAT = 'F', INT = 'I', BININT = 'J',
  BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N', PERSID = 'P', BINPERSID = 'Q', REDUCE = 'R',
  STRING = 'S', BINSTRING = 'T', SHORT_BINSTRING = 'U', UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a',
  BUILD = 'b', GLOBAL = 'c', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h',
  INST = 'i', LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p', BINPUT = 'q',
  LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
  PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85, TUPLE2 = 0x86,
  TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b, BINBYTES = 'B',
  SHORT_BINBYTES = 'C', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f,
  ADDITEMS = 0x90, FROZENSET = 0x91, NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
  BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98,
};

// Names of the opcodes that are refused, for the error message.
const char* refused_opcode_name(uint8_t op) {
  switch (op) {
    case POP: return "POP";
    case POP_MARK: return "POP_MARK";
    case DUP: return "DUP";
    case FLOAT: return "FLOAT";
    case INT: return "INT";
    case LONG: return "LONG";
    case PERSID: return "PERSID";
    case STRING: return "STRING";
    case BINSTRING: return "BINSTRING";
    case SHORT_BINSTRING: return "SHORT_BINSTRING";
    case UNICODE: return "UNICODE";
    case GET: return "GET";
    case INST: return "INST";
    case OBJ: return "OBJ";
    case PUT: return "PUT";
    case NEWOBJ: return "NEWOBJ";
    case EXT1: return "EXT1";
    case EXT2: return "EXT2";
    case EXT4: return "EXT4";
    case BINBYTES: return "BINBYTES";
    case SHORT_BINBYTES: return "SHORT_BINBYTES";
    case BINBYTES8: return "BINBYTES8";
    case EMPTY_SET: return "EMPTY_SET";
    case ADDITEMS: return "ADDITEMS";
    case FROZENSET: return "FROZENSET";
    case NEWOBJ_EX: return "NEWOBJ_EX";
    case BYTEARRAY8: return "BYTEARRAY8";
    case NEXT_BUFFER: return "NEXT_BUFFER";
    case READONLY_BUFFER: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// The globals a state dict may name. Each is a name here, interpreted by REDUCE/BINPERSID below;
// nothing is looked up or called.
enum class Global {
  OrderedDict,
  RebuildTensor,       // torch._utils._rebuild_tensor (storage, offset, size, stride)
  RebuildTensorV2,     // torch._utils._rebuild_tensor_v2 (..., requires_grad, hooks[, metadata])
  RebuildTensorV3,     // torch._utils._rebuild_tensor_v3 (..., requires_grad, hooks, dtype[, metadata])
  RebuildParameter,    // torch._utils._rebuild_parameter (data, requires_grad, hooks)
  RebuildParameterWithState,  // torch._utils._rebuild_parameter_with_state (data, requires_grad, hooks, state)
  StorageClass,        // torch.FloatStorage, ... and torch.UntypedStorage (dtype in Value::text)
  DType,               // torch.float16, ... (dtype in Value::text)
};

struct GlobalEntry {
  std::string_view module, name;
  Global kind;
  std::string_view dtype;  // StorageClass / DType: the element type ("" for UntypedStorage)
};

constexpr GlobalEntry kAllowedGlobals[] = {
    {"collections", "OrderedDict", Global::OrderedDict, ""},
    {"torch._utils", "_rebuild_tensor", Global::RebuildTensor, ""},
    {"torch._utils", "_rebuild_tensor_v2", Global::RebuildTensorV2, ""},
    {"torch._utils", "_rebuild_tensor_v3", Global::RebuildTensorV3, ""},
    {"torch._utils", "_rebuild_parameter", Global::RebuildParameter, ""},
    {"torch._utils", "_rebuild_parameter_with_state", Global::RebuildParameterWithState, ""},
    // Typed storage classes (torch/storage.py _dtype_to_storage_type_map), as torch.save names them.
    {"torch", "DoubleStorage", Global::StorageClass, "F64"},
    {"torch", "FloatStorage", Global::StorageClass, "F32"},
    {"torch", "HalfStorage", Global::StorageClass, "F16"},
    {"torch", "BFloat16Storage", Global::StorageClass, "BF16"},
    {"torch", "LongStorage", Global::StorageClass, "I64"},
    {"torch", "IntStorage", Global::StorageClass, "I32"},
    {"torch", "ShortStorage", Global::StorageClass, "I16"},
    {"torch", "CharStorage", Global::StorageClass, "I8"},
    {"torch", "ByteStorage", Global::StorageClass, "U8"},
    {"torch", "BoolStorage", Global::StorageClass, "BOOL"},
    {"torch", "ComplexFloatStorage", Global::StorageClass, "C64"},
    {"torch.storage", "UntypedStorage", Global::StorageClass, ""},  // how torch 2.x names it
    {"torch", "UntypedStorage", Global::StorageClass, ""},
    // dtypes (pickled by name), for _rebuild_tensor_v3.
    {"torch", "float32", Global::DType, "F32"},
    {"torch", "float16", Global::DType, "F16"},
    {"torch", "bfloat16", Global::DType, "BF16"},
    {"torch", "float64", Global::DType, "F64"},
    {"torch", "int64", Global::DType, "I64"},
    {"torch", "int32", Global::DType, "I32"},
    {"torch", "int16", Global::DType, "I16"},
    {"torch", "int8", Global::DType, "I8"},
    {"torch", "uint8", Global::DType, "U8"},
    {"torch", "uint16", Global::DType, "U16"},
    {"torch", "uint32", Global::DType, "U32"},
    {"torch", "uint64", Global::DType, "U64"},
    {"torch", "bool", Global::DType, "BOOL"},
    {"torch", "complex64", Global::DType, "C64"},
    {"torch", "float8_e4m3fn", Global::DType, "F8_E4M3"},
    {"torch", "float8_e5m2", Global::DType, "F8_E5M2"},
    {"torch", "float8_e8m0fnu", Global::DType, "F8_E8M0"},
};

enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Storage, Tensor };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Storage: return "storage";
    case Kind::Tensor: return "tensor";
  }
  return "?";
}

// One value. Values live in the unpickler's arena and refer to each other by pointer, so that
// containers that (through the memo) contain themselves cost neither a leak nor a loop: nothing
// walks a container recursively.
struct Value {
  Kind kind = Kind::None;
  int64_t integer = 0;              // Bool, Int
  double real = 0;                  // Float
  std::string text;                 // String; Global: "module.name"; Storage: key
  std::vector<Value*> items;        // Tuple, List; Dict: key, value, key, value, ...
  const GlobalEntry* global = nullptr;  // Global
  size_t index = 0;                 // Tensor: index into the records
};

// Nothing legitimate comes near these; they make the bounds explicit (each is also implied by the
// pickle's size, since every push or mark costs at least one byte of opcode).
// A torch state dict pickle makes about 20 values a tensor, so kMaxValues allows 200K tensors while
// bounding what a hostile pickle of 1-byte opcodes can make us allocate (about 100 bytes a value).
constexpr size_t kMaxValues = size_t{1} << 22;
constexpr size_t kMaxStack = size_t{1} << 22;
constexpr size_t kMaxMarks = size_t{1} << 20;
constexpr size_t kMaxGlobalLine = 256;
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxStorageKey = 64;

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> data, const std::string& origin, const std::string& name)
      : data_(data), origin_(origin), name_(name) {}

  StateDict run() {
    if (data_.empty()) fail("{}: {} is empty", origin_, name_);
    if (data_.size() > kMaxPickleBytes)
      fail("{}: {} is {} bytes, more than the {} a state dict pickle could need", origin_, name_, data_.size(),
           kMaxPickleBytes);
    Value* result = nullptr;
    while (result == nullptr) result = step();
    if (pos_ != data_.size()) error(fmt::format("{} bytes follow the STOP opcode", data_.size() - pos_));
    return extract(result);
  }

 private:
  [[noreturn]] void error(const std::string& problem) const {
    fail("{}: {} offset {}: {}", origin_, name_, op_pos_, problem);
  }

  // ---- reading bytes
  void need(uint64_t n, const char* what) const {
    if (n > data_.size() - pos_)
      error(fmt::format("truncated pickle: {} needs {} bytes, only {} left", what, n, data_.size() - pos_));
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;  // pickle integers are little-endian, like the host
  }
  std::string read_bytes(uint64_t n, const char* what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_.data() + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }
  std::string read_line(const char* what) {
    const size_t start = pos_;
    const size_t end = std::min(data_.size(), start + kMaxGlobalLine + 1);
    for (size_t i = start; i < end; ++i) {
      if (data_[i] == '\n') {
        pos_ = i + 1;
        return std::string(reinterpret_cast<const char*>(data_.data() + start), i - start);
      }
    }
    if (end == data_.size()) error(fmt::format("truncated pickle: {} has no end of line", what));
    error(fmt::format("{} is longer than {} bytes", what, kMaxGlobalLine));
  }

  // ---- values
  Value* make(Kind kind) {
    if (arena_.size() >= kMaxValues) error(fmt::format("pickle builds more than {} values", kMaxValues));
    arena_.emplace_back();
    arena_.back().kind = kind;
    return &arena_.back();
  }
  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Value* v) {
    if (stack_.size() >= kMaxStack) error("pickle stack deeper than any state dict needs");
    stack_.push_back(v);
  }
  Value* pop(const char* op) {
    if (stack_.size() <= base()) error(fmt::format("{} on an empty stack", op));
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top(const char* op) const {
    if (stack_.size() <= base()) error(fmt::format("{} on an empty stack", op));
    return stack_.back();
  }
  // The items pushed since the last MARK, which is removed.
  std::vector<Value*> pop_mark(const char* op) {
    if (marks_.empty()) error(fmt::format("{} without a MARK", op));
    const size_t b = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(b), stack_.end());
    stack_.resize(b);
    return items;
  }

  void memo_put(uint64_t index) {
    // CPython's pickler numbers memo entries from 0 in order, one PUT each: an index beyond the
    // pickle's size cannot come from it.
    if (index >= data_.size()) error(fmt::format("memo index {} is larger than the pickle could hold", index));
    if (stack_.size() <= base()) error("memo put on an empty stack");
    if (memo_.size() >= kMaxValues && memo_.find(index) == memo_.end())
      error(fmt::format("pickle memoizes more than {} values", kMaxValues));
    memo_[index] = stack_.back();
  }
  Value* memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) error(fmt::format("memo index {} was never stored", index));
    return it->second;
  }

  Value* make_int(int64_t v) {
    Value* x = make(Kind::Int);
    x->integer = v;
    return x;
  }
  Value* make_string(std::string s) {
    Value* x = make(Kind::String);
    x->text = std::move(s);
    return x;
  }
  Value* make_tuple(std::vector<Value*> items) {
    Value* x = make(Kind::Tuple);
    x->items = std::move(items);
    return x;
  }

  void push_global(const std::string& module, const std::string& name) {
    for (const GlobalEntry& g : kAllowedGlobals) {
      if (g.module == module && g.name == name) {
        Value* v = make(Kind::Global);
        v->global = &g;
        v->text = module + "." + name;
        push(v);
        return;
      }
    }
    fail("{}: refusing to load: the pickle calls {}.{}, which is not part of a state dict", origin_, shown(module),
         shown(name));
  }

  // ---- one opcode; returns the result at STOP, else nullptr
  Value* step() {
    op_pos_ = pos_;
    const uint8_t op = read<uint8_t>("opcode");
    switch (op) {
      case PROTO: {
        const uint8_t v = read<uint8_t>("protocol");
        if (v < 2 || v > 5) error(fmt::format("pickle protocol {} (torch.save writes 2)", v));
        return nullptr;
      }
      case FRAME: {  // protocol 4 framing: a length prefix only, the opcodes follow as usual
        const uint64_t n = read<uint64_t>("frame length");
        if (n > data_.size() - pos_) error(fmt::format("frame of {} bytes runs past the end", n));
        return nullptr;
      }
      case STOP: {
        if (!marks_.empty()) error("STOP with an open MARK");
        if (stack_.size() != 1) error(fmt::format("STOP with {} values on the stack (expected 1)", stack_.size()));
        return stack_.back();
      }
      case MARK:
        if (marks_.size() >= kMaxMarks) error("too many nested MARKs");
        marks_.push_back(stack_.size());
        return nullptr;
      case NONE: push(make(Kind::None)); return nullptr;
      case NEWTRUE:
      case NEWFALSE: {
        Value* v = make(Kind::Bool);
        v->integer = op == NEWTRUE;
        push(v);
        return nullptr;
      }
      case BININT: push(make_int(read<int32_t>("BININT"))); return nullptr;
      case BININT1: push(make_int(read<uint8_t>("BININT1"))); return nullptr;
      case BININT2: push(make_int(read<uint16_t>("BININT2"))); return nullptr;
      case LONG1:
      case LONG4: {
        const uint64_t n = op == LONG1 ? read<uint8_t>("LONG1 length") : read<uint32_t>("LONG4 length");
        if (n > 8) {
          need(n, "LONG");
          error(fmt::format("integer of {} bytes does not fit in 64 bits", n));
        }
        need(n, "LONG");
        uint64_t u = 0;
        for (uint64_t i = 0; i < n; ++i) u |= uint64_t{data_[pos_ + i]} << (8 * i);
        if (n > 0 && n < 8 && (data_[pos_ + n - 1] & 0x80)) u |= ~uint64_t{0} << (8 * n);  // sign-extend
        pos_ += n;
        push(make_int(static_cast<int64_t>(u)));
        return nullptr;
      }
      case BINFLOAT: {
        const uint64_t be = read<uint64_t>("BINFLOAT");
        Value* v = make(Kind::Float);
        v->real = std::bit_cast<double>(__builtin_bswap64(be));  // big-endian in the pickle
        push(v);
        return nullptr;
      }
      case BINUNICODE: push(make_string(read_bytes(read<uint32_t>("BINUNICODE length"), "BINUNICODE"))); return nullptr;
      case SHORT_BINUNICODE:
        push(make_string(read_bytes(read<uint8_t>("SHORT_BINUNICODE length"), "SHORT_BINUNICODE")));
        return nullptr;
      case BINUNICODE8:
        push(make_string(read_bytes(read<uint64_t>("BINUNICODE8 length"), "BINUNICODE8")));
        return nullptr;
      case EMPTY_TUPLE: push(make_tuple({})); return nullptr;
      case TUPLE1: {
        Value* a = pop("TUPLE1");
        push(make_tuple({a}));
        return nullptr;
      }
      case TUPLE2: {
        Value* b = pop("TUPLE2");
        Value* a = pop("TUPLE2");
        push(make_tuple({a, b}));
        return nullptr;
      }
      case TUPLE3: {
        Value* c = pop("TUPLE3");
        Value* b = pop("TUPLE3");
        Value* a = pop("TUPLE3");
        push(make_tuple({a, b, c}));
        return nullptr;
      }
      case TUPLE: push(make_tuple(pop_mark("TUPLE"))); return nullptr;
      case EMPTY_LIST: push(make(Kind::List)); return nullptr;
      case LIST: {
        Value* v = make(Kind::List);
        v->items = pop_mark("LIST");
        push(v);
        return nullptr;
      }
      case EMPTY_DICT: push(make(Kind::Dict)); return nullptr;
      case DICT: {
        std::vector<Value*> items = pop_mark("DICT");
        if (items.size() % 2 != 0) error("DICT with an odd number of items");
        Value* v = make(Kind::Dict);
        v->items = std::move(items);
        push(v);
        return nullptr;
      }
      case APPEND: {
        Value* x = pop("APPEND");
        Value* list = top("APPEND");
        if (list->kind != Kind::List) error(fmt::format("APPEND to a {}", kind_name(list->kind)));
        list->items.push_back(x);
        return nullptr;
      }
      case APPENDS: {
        std::vector<Value*> items = pop_mark("APPENDS");
        Value* list = top("APPENDS");
        if (list->kind != Kind::List) error(fmt::format("APPENDS to a {}", kind_name(list->kind)));
        list->items.insert(list->items.end(), items.begin(), items.end());
        return nullptr;
      }
      case SETITEM: {
        Value* value = pop("SETITEM");
        Value* key = pop("SETITEM");
        Value* dict = top("SETITEM");
        if (dict->kind != Kind::Dict) error(fmt::format("SETITEM on a {}", kind_name(dict->kind)));
        dict->items.push_back(key);
        dict->items.push_back(value);
        return nullptr;
      }
      case SETITEMS: {
        std::vector<Value*> items = pop_mark("SETITEMS");
        if (items.size() % 2 != 0) error("SETITEMS with an odd number of items");
        Value* dict = top("SETITEMS");
        if (dict->kind != Kind::Dict) error(fmt::format("SETITEMS on a {}", kind_name(dict->kind)));
        dict->items.insert(dict->items.end(), items.begin(), items.end());
        return nullptr;
      }
      case BINPUT: memo_put(read<uint8_t>("BINPUT index")); return nullptr;
      case LONG_BINPUT: memo_put(read<uint32_t>("LONG_BINPUT index")); return nullptr;
      case MEMOIZE: memo_put(memo_.size()); return nullptr;
      case BINGET: push(memo_get(read<uint8_t>("BINGET index"))); return nullptr;
      case LONG_BINGET: push(memo_get(read<uint32_t>("LONG_BINGET index"))); return nullptr;
      case GLOBAL: {
        const std::string module = read_line("GLOBAL module");
        const std::string name = read_line("GLOBAL name");
        push_global(module, name);
        return nullptr;
      }
      case STACK_GLOBAL: {
        Value* name = pop("STACK_GLOBAL");
        Value* module = pop("STACK_GLOBAL");
        if (module->kind != Kind::String || name->kind != Kind::String) error("STACK_GLOBAL of non-strings");
        push_global(module->text, name->text);
        return nullptr;
      }
      case BINPERSID: push(persistent_load(pop("BINPERSID"))); return nullptr;
      case REDUCE: {
        Value* args = pop("REDUCE");
        Value* callable = pop("REDUCE");
        push(reduce(callable, args));
        return nullptr;
      }
      case BUILD: {
        Value* state = pop("BUILD");
        Value* target = top("BUILD");
        // OrderedDict's state is its __dict__ (a state dict's _metadata of module versions), which
        // names nothing we need; nothing else a state dict holds is built.
        if (target->kind != Kind::Dict || (state->kind != Kind::Dict && state->kind != Kind::None))
          error(fmt::format("BUILD of a {} with a {} state, which is not part of a state dict", kind_name(target->kind),
                            kind_name(state->kind)));
        return nullptr;
      }
      default: {
        if (const char* name = refused_opcode_name(op))
          error(fmt::format("unsupported pickle opcode {} (0x{:02x}), which a state dict does not need", name, op));
        error(fmt::format("unknown pickle opcode 0x{:02x}", op));
      }
    }
  }

  // ('storage', storage_class, key, location, numel)
  Value* persistent_load(Value* pid) {
    if (pid->kind != Kind::Tuple || pid->items.size() != 5)
      error(fmt::format("persistent id is a {} of {} items, not ('storage', type, key, location, numel)",
                        kind_name(pid->kind), pid->items.size()));
    const auto& it = pid->items;
    if (it[0]->kind != Kind::String || it[0]->text != "storage")
      error("persistent id does not start with 'storage'");
    if (it[1]->kind != Kind::Global || it[1]->global->kind != Global::StorageClass)
      error(fmt::format("persistent id names a {} ({}), not a storage class", kind_name(it[1]->kind),
                        shown(it[1]->text)));
    if (it[2]->kind != Kind::String) error("persistent id's storage key is not a string");
    if (it[3]->kind != Kind::String) error("persistent id's location is not a string");
    if (it[4]->kind != Kind::Int || it[4]->integer < 0) error("persistent id's size is not a non-negative int");
    const std::string& key = it[2]->text;
    // torch.save names storages "0", "1", ...; the key becomes part of a zip entry name.
    bool key_ok = !key.empty() && key.size() <= kMaxStorageKey && key != "." && key != "..";
    for (char c : key)
      key_ok = key_ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                          c == '-' || c == '.');
    if (!key_ok) error(fmt::format("storage key '{}' is not a plain name", shown(key)));

    StorageRef ref;
    ref.key = key;
    const std::string_view dtype = it[1]->global->dtype;
    ref.dtype = dtype.empty() ? "U8" : std::string(dtype);  // untyped: bytes
    const uint64_t elem = hf::dtype_bits(ref.dtype) / 8;
    if (__builtin_mul_overflow(static_cast<uint64_t>(it[4]->integer), elem, &ref.n_bytes) ||
        ref.n_bytes > (uint64_t{1} << 62))
      error(fmt::format("storage '{}' of {} {} elements is impossibly large", shown(key), it[4]->integer, ref.dtype));
    ref.location = it[3]->text;

    const auto found = result_.storages.find(key);
    if (found == result_.storages.end()) {
      result_.storages.emplace(key, ref);
    } else if (found->second.dtype != ref.dtype || found->second.n_bytes != ref.n_bytes) {
      error(fmt::format("storage '{}' is named as {} bytes of {} and as {} bytes of {}", shown(key),
                        found->second.n_bytes, found->second.dtype, ref.n_bytes, ref.dtype));
    }
    Value* v = make(Kind::Storage);
    v->text = key;
    v->global = it[1]->global;
    return v;
  }

  // Tensor records hold their sizes and strides by value, and one memoized argument tuple can be
  // REDUCEd (or one tensor named) many times for a few bytes each: the dimensions stored in all
  // records together are bounded by the pickle's size (a real pickle spends >= 2 bytes a dimension).
  void charge(size_t dims) {
    const uint64_t cost = 2 * dims + 1;
    if (cost > budget_) error("pickle builds more tensor records than its size could describe");
    budget_ -= cost;
  }

  int64_t want_int(Value* v, const char* what, int64_t min) {
    if (v->kind != Kind::Int) error(fmt::format("{} is a {}, not an int", what, kind_name(v->kind)));
    if (v->integer < min) error(fmt::format("{} is {}", what, v->integer));
    return v->integer;
  }

  std::vector<int64_t> want_int_tuple(Value* v, const char* what) {
    if (v->kind != Kind::Tuple) error(fmt::format("tensor {} is a {}, not a tuple", what, kind_name(v->kind)));
    if (v->items.size() > kMaxDims) error(fmt::format("tensor {} has {} dimensions", what, v->items.size()));
    std::vector<int64_t> out;
    out.reserve(v->items.size());
    for (Value* x : v->items) out.push_back(want_int(x, what, 0));
    return out;
  }

  // A dense tensor: storage, offset, size, stride; dtype from the storage or (v3) given.
  Value* rebuild_tensor(const std::vector<Value*>& a, const char* fn, const Value* dtype_global) {
    if (a[0]->kind != Kind::Storage) error(fmt::format("{}: first argument is a {}, not a storage", fn, kind_name(a[0]->kind)));
    const StorageRef& storage = result_.storages.at(a[0]->text);
    const bool untyped = a[0]->global->dtype.empty();
    TensorRecord t;
    if (dtype_global != nullptr) {
      if (dtype_global->kind != Kind::Global || dtype_global->global->kind != Global::DType)
        error(fmt::format("{}: dtype argument is a {}, not a torch dtype", fn, kind_name(dtype_global->kind)));
      if (!untyped) error(fmt::format("{} with a typed storage", fn));
      t.dtype = std::string(dtype_global->global->dtype);
    } else {
      if (untyped) error(fmt::format("{} with an untyped storage and no dtype", fn));
      t.dtype = storage.dtype;
    }
    t.storage_key = storage.key;
    t.storage_offset = static_cast<uint64_t>(want_int(a[1], "storage offset", 0));
    t.shape = want_int_tuple(a[2], "size");
    t.strides = want_int_tuple(a[3], "stride");
    if (t.shape.size() != t.strides.size())
      error(fmt::format("tensor size has {} dimensions but stride has {}", t.shape.size(), t.strides.size()));
    uint64_t numel = 1;
    for (int64_t d : t.shape)
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
        error("tensor has more than 2^64 elements");
    t.n_elements = numel;
    // Extent in elements from the offset, then in bytes, each step overflow-checked.
    uint64_t extent = numel == 0 ? 0 : 1;
    if (numel != 0) {
      for (size_t i = 0; i < t.shape.size(); ++i) {
        uint64_t span;
        if (__builtin_mul_overflow(static_cast<uint64_t>(t.shape[i] - 1), static_cast<uint64_t>(t.strides[i]), &span) ||
            __builtin_add_overflow(extent, span, &extent))
          error("tensor strides reach past 2^64 elements");
      }
    }
    const uint64_t elem = hf::dtype_bits(t.dtype) / 8;
    uint64_t end_elems, end_bytes;
    if (__builtin_add_overflow(t.storage_offset, extent, &end_elems) ||
        __builtin_mul_overflow(end_elems, elem, &end_bytes) || end_bytes > storage.n_bytes)
      error(fmt::format("tensor of size {} stride {} at storage offset {} reaches past the end of storage '{}' "
                        "({} bytes of {})",
                        fmt::join(t.shape, "x"), fmt::join(t.strides, ","), t.storage_offset, shown(storage.key),
                        storage.n_bytes, storage.dtype));
    charge(t.shape.size());
    records_.push_back(std::move(t));
    Value* v = make(Kind::Tensor);
    v->index = records_.size() - 1;
    return v;
  }

  void want_bool(Value* v, const char* fn) {
    if (v->kind != Kind::Bool) error(fmt::format("{}: requires_grad is a {}, not a bool", fn, kind_name(v->kind)));
  }
  void want_dict(Value* v, const char* fn, const char* what) {
    if (v->kind != Kind::Dict) error(fmt::format("{}: {} is a {}, not a dict", fn, what, kind_name(v->kind)));
  }

  Value* reduce(Value* callable, Value* args) {
    if (callable->kind != Kind::Global) error(fmt::format("REDUCE calls a {}", kind_name(callable->kind)));
    if (args->kind != Kind::Tuple) error(fmt::format("REDUCE with {} arguments, not a tuple", kind_name(args->kind)));
    const std::vector<Value*>& a = args->items;
    const size_t n = a.size();
    switch (callable->global->kind) {
      case Global::OrderedDict:
        if (n != 0) error("OrderedDict called with arguments");
        return make(Kind::Dict);
      case Global::RebuildTensor:
        if (n != 4) error(fmt::format("_rebuild_tensor with {} arguments (expected 4)", n));
        return rebuild_tensor(a, "_rebuild_tensor", nullptr);
      case Global::RebuildTensorV2:
        if (n != 6 && n != 7) error(fmt::format("_rebuild_tensor_v2 with {} arguments (expected 6 or 7)", n));
        want_bool(a[4], "_rebuild_tensor_v2");
        want_dict(a[5], "_rebuild_tensor_v2", "backward_hooks");
        if (n == 7) want_dict(a[6], "_rebuild_tensor_v2", "metadata");
        return rebuild_tensor(a, "_rebuild_tensor_v2", nullptr);
      case Global::RebuildTensorV3:
        if (n != 7 && n != 8) error(fmt::format("_rebuild_tensor_v3 with {} arguments (expected 7 or 8)", n));
        want_bool(a[4], "_rebuild_tensor_v3");
        want_dict(a[5], "_rebuild_tensor_v3", "backward_hooks");
        if (n == 8) want_dict(a[7], "_rebuild_tensor_v3", "metadata");
        return rebuild_tensor(a, "_rebuild_tensor_v3", a[6]);
      case Global::RebuildParameter:
      case Global::RebuildParameterWithState: {
        const bool with_state = callable->global->kind == Global::RebuildParameterWithState;
        const char* fn = with_state ? "_rebuild_parameter_with_state" : "_rebuild_parameter";
        if (n != (with_state ? 4u : 3u)) error(fmt::format("{} with {} arguments", fn, n));
        if (a[0]->kind != Kind::Tensor) error(fmt::format("{} of a {}, not a tensor", fn, kind_name(a[0]->kind)));
        want_bool(a[1], fn);
        want_dict(a[2], fn, "backward_hooks");
        if (with_state) want_dict(a[3], fn, "state");
        return a[0];  // a parameter is its data
      }
      case Global::StorageClass:
      case Global::DType:
        break;
    }
    error(fmt::format("REDUCE calls {}, which only names a type", callable->text));
  }

  StateDict extract(Value* root) {
    if (root->kind != Kind::Dict)
      error(fmt::format("the pickle holds a {}, not a state dict (a dict of tensors)", kind_name(root->kind)));
    std::unordered_set<std::string_view> names;
    result_.tensors.reserve(root->items.size() / 2);
    for (size_t i = 0; i + 1 < root->items.size(); i += 2) {
      const Value* key = root->items[i];
      const Value* value = root->items[i + 1];
      if (key->kind != Kind::String) error(fmt::format("state dict has a {} key, not a string", kind_name(key->kind)));
      if (value->kind != Kind::Tensor)
        error(fmt::format("state dict entry '{}' is a {}, not a tensor", shown(key->text), kind_name(value->kind)));
      if (!names.insert(key->text).second) error(fmt::format("state dict names '{}' twice", shown(key->text)));
      TensorRecord t = records_[value->index];
      charge(t.shape.size());
      t.name = key->text;
      result_.tensors.push_back(std::move(t));
    }
    return std::move(result_);
  }

  std::span<const uint8_t> data_;
  const std::string& origin_;
  const std::string& name_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint64_t budget_ = data_.size();
  std::deque<Value> arena_;  // stable addresses
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
  std::vector<TensorRecord> records_;
  StateDict result_;
};

}  // namespace

StateDict parse_state_dict(std::span<const uint8_t> pickle, const std::string& origin, const std::string& pickle_name) {
  Unpickler u(pickle, origin, pickle_name);
  return u.run();
}

}  // namespace fdpp::torch_pickle
