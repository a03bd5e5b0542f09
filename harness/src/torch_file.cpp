#include "gpufeed/harness/torch_file.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/ops/empty.h>
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>


namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const std::string& name, const std::string& why) {
  throw std::runtime_error(name + ": " + why);
}

// ---------------------------------------------------------------------------------------------
// The restricted unpickler. The stack holds values, marks and references to globals (classes or
// functions named by the pickle); only the globals torch.save uses for its own objects are ever
// "called", and only to build plain data.

struct Item {
  enum class Kind { kValue, kMark, kGlobal };
  Kind kind = Kind::kValue;
  c10::IValue value;
  std::string global;  // "module.name" for kGlobal
};

c10::ScalarType storage_dtype(const std::string& name, const std::string& file) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"torch.FloatStorage", c10::kFloat},
      {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},
      {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},
      {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},
      {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},
      {"torch.BoolStorage", c10::kBool},
      {"torch.ComplexFloatStorage", c10::kComplexFloat},
      {"torch.ComplexDoubleStorage", c10::kComplexDouble},
      {"torch.UntypedStorage", c10::kByte},
      {"torch.storage.UntypedStorage", c10::kByte},
  };
  auto it = kTypes.find(name);
  if (it == kTypes.end()) fail(file, "unsupported tensor storage type " + name);
  return it->second;
}

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
}

c10::IValue opaque(const std::string& cls) {
  auto d = new_dict();
  d.insert("__class__", cls);
  return d;
}

std::string global_ref(const std::string& name) { return "<global " + name + ">"; }

// The pickle opcodes this unpickler reads, named as Python's pickle.py names them (the protocol
// that introduced each in brackets). Text opcodes (protocol 0) end with a newline.
enum class Op : uint8_t {
  MARK = '(',  // push a mark
  STOP = '.',  // end: the top of the stack is the value
  POP = '0',
  POP_MARK = '1',  // drop everything down to the topmost mark
  DUP = '2',
  FLOAT = 'F',    // text
  INT = 'I',      // text; "01"/"00" are bools
  BININT = 'J',   // 4-byte signed
  BININT1 = 'K',  // 1-byte unsigned
  LONG = 'L',     // text, optional trailing 'L'
  BININT2 = 'M',  // 2-byte unsigned
  NONE = 'N',
  PERSID = 'P',           // text persistent id (torch.save uses BINPERSID)
  BINPERSID = 'Q',        // persistent id from the stack
  REDUCE = 'R',           // call a global with an argument tuple
  STRING = 'S',           // quoted text
  BINSTRING = 'T',        // 4-byte length
  SHORT_BINSTRING = 'U',  // 1-byte length
  UNICODE = 'V',          // raw text
  BINUNICODE = 'X',       // UTF-8, 4-byte length
  APPEND = 'a',
  BUILD = 'b',   // __setstate__ / __dict__ update
  GLOBAL = 'c',  // text "module\nname\n"
  DICT = 'd',    // dict from the items above the mark
  EMPTY_DICT = '}',
  APPENDS = 'e',
  GET = 'g',          // memo, text key
  BINGET = 'h',       // memo, 1-byte key
  LONG_BINGET = 'j',  // memo, 4-byte key
  LIST = 'l',         // list from the items above the mark
  EMPTY_LIST = ']',
  PUT = 'p',          // memo, text key
  BINPUT = 'q',       // memo, 1-byte key
  LONG_BINPUT = 'r',  // memo, 4-byte key
  SETITEM = 's',
  TUPLE = 't',  // tuple from the items above the mark
  EMPTY_TUPLE = ')',
  SETITEMS = 'u',
  BINFLOAT = 'G',           // 8-byte big-endian double
  PROTO = 0x80,             // [2] protocol version
  NEWOBJ = 0x81,            // [2] cls.__new__(cls, *args)
  TUPLE1 = 0x85,            // [2]
  TUPLE2 = 0x86,            // [2]
  TUPLE3 = 0x87,            // [2]
  NEWTRUE = 0x88,           // [2]
  NEWFALSE = 0x89,          // [2]
  LONG1 = 0x8a,             // [2] little-endian two's complement, 1-byte length
  LONG4 = 0x8b,             // [2] same, 4-byte length
  BINBYTES = 'B',           // [3] 4-byte length
  SHORT_BINBYTES = 'C',     // [3] 1-byte length
  SHORT_BINUNICODE = 0x8c,  // [4]
  BINUNICODE8 = 0x8d,       // [4]
  BINBYTES8 = 0x8e,         // [4]
  EMPTY_SET = 0x8f,         // [4]
  ADDITEMS = 0x90,          // [4] add the items above the mark to a set
  FROZENSET = 0x91,         // [4]
  NEWOBJ_EX = 0x92,         // [4] with keyword arguments
  STACK_GLOBAL = 0x93,      // [4] module and name from the stack
  MEMOIZE = 0x94,           // [4] memo, the next key
  FRAME = 0x95,             // [4] 8-byte frame length
  BYTEARRAY8 = 0x96,        // [5]
};

class Unpickler {
 public:
  Unpickler(const char* data, size_t size, std::string name,
            caffe2::serialize::PyTorchStreamReader& reader)
      : p_(data), end_(data + size), name_(std::move(name)), reader_(reader) {}

  c10::IValue run() {
    while (true) {
      const auto op = static_cast<Op>(u8());
      if (op == Op::STOP) {
        if (stack_.empty()) bad("STOP with an empty stack");
        return value(pop());
      }
      if (op == Op::PERSID) bad("text persistent ids (PERSID) are not used by torch.save");
      if (!(framing_or_stack(op) || push_scalar(op) || push_text(op) || build_container(op) ||
            fill_container(op) || call_or_build_object(op) || memo_or_persistent(op))) {
        bad("unsupported pickle opcode 0x" + hex(static_cast<uint8_t>(op)));
      }
    }
  }

 private:
  // -- reading ---------------------------------------------------------------------------------
  [[noreturn]] void bad(const std::string& why) const {
    fail(name_, "malformed or unsupported data.pkl: " + why);
  }
  static std::string hex(unsigned v) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%02x", v);
    return buf;
  }
  const char* bytes(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) bad("truncated");
    const char* r = p_;
    p_ += n;
    return r;
  }
  uint8_t u8() { return static_cast<uint8_t>(*bytes(1)); }
  template <class T>
  T le() {
    T v;
    std::memcpy(&v, bytes(sizeof(T)), sizeof(T));  // x86/ARM hosts are little-endian
    return v;
  }
  double be_double() {
    const char* b = bytes(8);
    char r[8];
    for (int i = 0; i < 8; ++i) r[i] = b[7 - i];
    double d;
    std::memcpy(&d, r, 8);
    return d;
  }
  int64_t long_bytes(size_t n) {
    if (n > 8) bad("integer wider than 64 bits");
    const char* b = bytes(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(v);
  }
  std::string str(uint64_t n) {
    const char* b = bytes(n);
    return std::string(b, n);
  }
  std::string line() {
    const char* nl = static_cast<const char*>(std::memchr(p_, '\n', end_ - p_));
    if (!nl) bad("unterminated text field");
    std::string s(p_, nl);
    p_ = nl + 1;
    return s;
  }

  // -- opcodes, by group: each returns false for an opcode not its own -------------------------
  bool framing_or_stack(Op op) {
    switch (op) {
      case Op::PROTO:
        u8();
        return true;
      case Op::FRAME:
        bytes(8);  // length only
        return true;
      case Op::MARK:
        push_mark();
        return true;
      case Op::POP:
        pop();
        return true;
      case Op::POP_MARK:
        pop_to_mark();
        return true;
      case Op::DUP:
        stack_.push_back(top());
        return true;
      default:
        return false;
    }
  }

  bool push_scalar(Op op) {
    switch (op) {
      case Op::NONE:
        push(c10::IValue());
        return true;
      case Op::NEWTRUE:
        push(true);
        return true;
      case Op::NEWFALSE:
        push(false);
        return true;
      case Op::BININT:
        push(static_cast<int64_t>(le<int32_t>()));
        return true;
      case Op::BININT1:
        push(static_cast<int64_t>(u8()));
        return true;
      case Op::BININT2:
        push(static_cast<int64_t>(le<uint16_t>()));
        return true;
      case Op::LONG1:
        push(long_bytes(u8()));
        return true;
      case Op::LONG4:
        push(long_bytes(le<uint32_t>()));
        return true;
      case Op::INT: {  // text; "01" and "00" are protocol 0's bools
        const std::string s = line();
        if (s == "01")
          push(true);
        else if (s == "00")
          push(false);
        else
          push(static_cast<int64_t>(std::stoll(s)));
        return true;
      }
      case Op::LONG: {  // text
        std::string s = line();
        if (!s.empty() && s.back() == 'L') s.pop_back();
        push(static_cast<int64_t>(std::stoll(s)));
        return true;
      }
      case Op::BINFLOAT:
        push(be_double());
        return true;
      case Op::FLOAT:  // text
        push(std::stod(line()));
        return true;
      default:
        return false;
    }
  }

  // Text and bytes alike become strings.
  bool push_text(Op op) {
    switch (op) {
      case Op::BINUNICODE:
      case Op::BINSTRING:
      case Op::BINBYTES:
        push(str(le<uint32_t>()));
        return true;
      case Op::SHORT_BINUNICODE:
      case Op::SHORT_BINSTRING:
      case Op::SHORT_BINBYTES:
        push(str(u8()));
        return true;
      case Op::BINUNICODE8:
      case Op::BINBYTES8:
      case Op::BYTEARRAY8:
        push(str(le<uint64_t>()));
        return true;
      case Op::UNICODE:  // raw text
        push(line());
        return true;
      case Op::STRING: {  // quoted text
        std::string s = line();
        if (s.size() >= 2) s = s.substr(1, s.size() - 2);
        push(s);
        return true;
      }
      default:
        return false;
    }
  }

  // Sets and frozensets become lists.
  bool build_container(Op op) {
    switch (op) {
      case Op::EMPTY_DICT:
        push(new_dict());
        return true;
      case Op::EMPTY_LIST:
      case Op::EMPTY_SET:
        push(c10::impl::GenericList(c10::AnyType::get()));
        return true;
      case Op::EMPTY_TUPLE:
        push(c10::ivalue::Tuple::create({}));
        return true;
      case Op::DICT: {
        auto items = pop_to_mark();
        auto d = new_dict();
        set_items(d, items);
        push(d);
        return true;
      }
      case Op::LIST:
      case Op::FROZENSET: {
        auto items = pop_to_mark();
        auto l = c10::impl::GenericList(c10::AnyType::get());
        for (auto& it : items) l.push_back(value(it));
        push(l);
        return true;
      }
      case Op::TUPLE:
        push(tuple(pop_to_mark()));
        return true;
      case Op::TUPLE1: {
        auto a = pop();
        push(tuple({a}));
        return true;
      }
      case Op::TUPLE2: {
        auto b = pop(), a = pop();
        push(tuple({a, b}));
        return true;
      }
      case Op::TUPLE3: {
        auto c = pop(), b = pop(), a = pop();
        push(tuple({a, b, c}));
        return true;
      }
      default:
        return false;
    }
  }

  bool fill_container(Op op) {
    switch (op) {
      case Op::APPEND: {
        auto v = pop();
        append(top(), {v});
        return true;
      }
      case Op::APPENDS:
      case Op::ADDITEMS: {
        auto items = pop_to_mark();
        append(top(), items);
        return true;
      }
      case Op::SETITEM: {
        auto v = pop(), k = pop();
        setitems_on(top(), {k, v});
        return true;
      }
      case Op::SETITEMS: {
        auto items = pop_to_mark();
        setitems_on(top(), items);
        return true;
      }
      default:
        return false;
    }
  }

  bool call_or_build_object(Op op) {
    switch (op) {
      case Op::GLOBAL: {
        std::string module = line();
        std::string name = line();
        push_global(module + "." + name);
        return true;
      }
      case Op::STACK_GLOBAL: {
        auto name = pop(), module = pop();
        push_global(string_of(module) + "." + string_of(name));
        return true;
      }
      case Op::REDUCE: {
        auto args = pop(), fn = pop();
        push(reduce(fn, args));
        return true;
      }
      case Op::NEWOBJ: {
        pop();  // args
        auto cls = pop();
        push(new_object(cls));
        return true;
      }
      case Op::NEWOBJ_EX: {
        pop();  // kwargs
        pop();  // args
        auto cls = pop();
        push(new_object(cls));
        return true;
      }
      case Op::BUILD: {
        auto state = pop();
        build(top(), state);
        return true;
      }
      default:
        return false;
    }
  }

  bool memo_or_persistent(Op op) {
    switch (op) {
      case Op::PUT:
        memo_[std::stoul(line())] = top();
        return true;
      case Op::BINPUT:
        memo_[u8()] = top();
        return true;
      case Op::LONG_BINPUT:
        memo_[le<uint32_t>()] = top();
        return true;
      case Op::MEMOIZE:
        memo_[memo_.size()] = top();
        return true;
      case Op::GET:
        stack_.push_back(memo(std::stoul(line())));
        return true;
      case Op::BINGET:
        stack_.push_back(memo(u8()));
        return true;
      case Op::LONG_BINGET:
        stack_.push_back(memo(le<uint32_t>()));
        return true;
      case Op::BINPERSID:
        push(persistent_load(value(pop())));
        return true;
      default:
        return false;
    }
  }

  // -- stack -----------------------------------------------------------------------------------
  void push(c10::IValue v) { stack_.push_back(Item{Item::Kind::kValue, std::move(v), {}}); }
  void push_mark() { stack_.push_back(Item{Item::Kind::kMark, {}, {}}); }
  void push_global(std::string name) {
    stack_.push_back(Item{Item::Kind::kGlobal, {}, std::move(name)});
  }
  Item pop() {
    if (stack_.empty()) bad("stack underflow");
    Item it = std::move(stack_.back());
    stack_.pop_back();
    if (it.kind == Item::Kind::kMark) bad("unexpected MARK");
    return it;
  }
  Item& top() {
    if (stack_.empty()) bad("stack underflow");
    return stack_.back();
  }
  std::vector<Item> pop_to_mark() {
    size_t i = stack_.size();
    while (i > 0 && stack_[i - 1].kind != Item::Kind::kMark) --i;
    if (i == 0) bad("no MARK on the stack");
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + static_cast<long>(i)),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(i - 1);
    return items;
  }
  Item memo(size_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) bad("memo key " + std::to_string(k) + " not found");
    return it->second;
  }
  // A stack item as a plain value (globals become "<global name>" strings).
  static c10::IValue value(const Item& it) {
    if (it.kind == Item::Kind::kGlobal) return global_ref(it.global);
    return it.value;
  }
  static std::string string_of(const Item& it) {
    if (it.kind == Item::Kind::kValue && it.value.isString()) return it.value.toStringRef();
    return "?";
  }
  static c10::IValue tuple(const std::vector<Item>& items) {
    std::vector<c10::IValue> v;
    v.reserve(items.size());
    for (auto& it : items) v.push_back(value(it));
    return c10::ivalue::Tuple::create(std::move(v));
  }
  static c10::IValue dict_key(const c10::IValue& k) {
    // GenericDict hashes strings, numbers, bools and tensors; anything else is keyed by its text.
    if (k.isString() || k.isInt() || k.isDouble() || k.isBool() || k.isTensor()) return k;
    std::ostringstream os;
    os << k;
    return os.str();
  }
  void set_items(c10::impl::GenericDict& d, const std::vector<Item>& items) {
    if (items.size() % 2) bad("odd number of items for a dict");
    for (size_t i = 0; i < items.size(); i += 2) {
      d.insert_or_assign(dict_key(value(items[i])), value(items[i + 1]));
    }
  }
  void setitems_on(Item& target, const std::vector<Item>& items) {
    if (target.kind != Item::Kind::kValue || !target.value.isGenericDict()) {
      bad("SETITEM(S) on something that is not a dict");
    }
    auto d = target.value.toGenericDict();
    set_items(d, items);
  }
  void append(Item& target, const std::vector<Item>& items) {
    if (target.kind == Item::Kind::kValue && target.value.isList()) {
      auto l = target.value.toList();
      for (auto& it : items) l.push_back(value(it));
    } else if (target.kind == Item::Kind::kValue && target.value.isGenericDict()) {
      // An opaque list subclass: keep its items under "__items__".
      auto d = target.value.toGenericDict();
      if (!d.contains("__items__"))
        d.insert("__items__", c10::impl::GenericList(c10::AnyType::get()));
      auto l = d.at("__items__").toList();
      for (auto& it : items) l.push_back(value(it));
    } else {
      bad("APPEND(S) on something that is not a list");
    }
  }

  // -- objects ---------------------------------------------------------------------------------
  c10::IValue new_object(const Item& cls) {
    if (cls.kind != Item::Kind::kGlobal) bad("NEWOBJ of something that is not a class");
    if (cls.global == "collections.OrderedDict" || cls.global == "builtins.dict") return new_dict();
    if (cls.global == "builtins.list" || cls.global == "builtins.set") {
      return c10::impl::GenericList(c10::AnyType::get());
    }
    return opaque(cls.global);
  }

  void build(Item& target, const Item& state) {
    // OrderedDict's state is its instance __dict__ (state_dict()'s _metadata): dropped, as
    // load_state_dict never needs it. An opaque object takes its state as entries.
    if (target.kind != Item::Kind::kValue || !target.value.isGenericDict()) return;
    auto d = target.value.toGenericDict();
    if (!d.contains("__class__")) return;
    const c10::IValue s = value(state);
    if (s.isGenericDict()) {
      for (const auto& kv : s.toGenericDict()) {
        if (kv.key() != c10::IValue("__class__")) d.insert_or_assign(kv.key(), kv.value());
      }
    } else {
      d.insert_or_assign("__state__", s);
    }
  }

  std::vector<c10::IValue> tuple_elements(const c10::IValue& v, const char* what) {
    if (!v.isTuple()) bad(std::string(what) + ": arguments are not a tuple");
    return v.toTupleRef().elements().vec();
  }

  static std::vector<int64_t> int_list(const c10::IValue& v) {
    std::vector<int64_t> out;
    if (v.isTuple()) {
      for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toInt());
    } else if (v.isList()) {
      for (const auto& e : v.toList()) out.push_back(c10::IValue(e).toInt());
    }
    return out;
  }

  c10::IValue reduce(const Item& fn, const Item& args_item) {
    const c10::IValue args = value(args_item);
    if (fn.kind != Item::Kind::kGlobal) {
      // Calling an object that is not a global: nothing torch.save writes does this.
      return opaque("<call>");
    }
    const std::string& f = fn.global;
    if (f == "collections.OrderedDict" || f == "builtins.dict") return dict_of_pairs(args);
    if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") {
      return rebuild_tensor(f, args);
    }
    if (f == "torch._utils._rebuild_parameter" ||
        f == "torch._utils._rebuild_parameter_with_state") {
      const auto a = tuple_elements(args, f.c_str());
      if (a.empty() || !a[0].isTensor()) bad(f + ": unexpected arguments");
      return a[0];
    }
    if (f == "torch._tensor._rebuild_from_type_v2" || f == "torch._tensor._rebuild_from_type") {
      return rebuild_from_type(f, args);
    }
    if (f.rfind("torch.jit._pickle.build_", 0) == 0 || f == "torch.jit._pickle.restore_type_tag") {
      // TorchScript's pickler (torch::pickle_save) tags typed lists and containers this way.
      const auto a = tuple_elements(args, f.c_str());
      if (a.empty()) bad(f + ": no arguments");
      return a[0];
    }
    if (f == "torch.Size") {
      const auto a = tuple_elements(args, f.c_str());
      return a.empty() ? c10::IValue(c10::ivalue::Tuple::create({})) : a[0];
    }
    if (f == "torch.device") return device_text(tuple_elements(args, f.c_str()));
    if (f == "_codecs.encode") {  // protocol 2 writes bytes as _codecs.encode(text, "latin1")
      const auto a = tuple_elements(args, f.c_str());
      return !a.empty() && a[0].isString() ? latin1_bytes(a[0].toStringRef()) : std::string();
    }
    if (f == "builtins.set" || f == "builtins.frozenset" || f == "builtins.list") {
      const auto a = tuple_elements(args, f.c_str());
      if (!a.empty() && a[0].isList()) return a[0];
      return c10::impl::GenericList(c10::AnyType::get());
    }
    if (f == "copyreg._reconstructor") {  // (cls, base, state) for protocol < 2 objects
      const auto a = tuple_elements(args, f.c_str());
      std::string cls = !a.empty() && a[0].isString() ? a[0].toStringRef() : "?";
      if (cls.rfind("<global ", 0) == 0) cls = cls.substr(8, cls.size() - 9);
      return opaque(cls);
    }
    // Anything else is a foreign object: record what it was, build nothing.
    auto d = new_dict();
    d.insert("__class__", f);
    d.insert("__args__", args);
    return d;
  }

  // OrderedDict([(key, value), ...]) / dict(...): the pairs of the first argument, if any.
  static c10::IValue dict_of_pairs(const c10::IValue& args) {
    auto d = new_dict();
    if (args.isTuple() && !args.toTupleRef().elements().empty()) {
      const auto& pairs = args.toTupleRef().elements()[0];
      if (pairs.isList()) {
        for (const auto& pr : pairs.toList()) {
          const c10::IValue p(pr);
          if (p.isTuple() && p.toTupleRef().elements().size() == 2) {
            d.insert_or_assign(dict_key(p.toTupleRef().elements()[0]),
                               p.toTupleRef().elements()[1]);
          }
        }
      }
    }
    return d;
  }

  // _rebuild_tensor(_v2)(storage, offset, size, stride, ...): a view of the storage.
  c10::IValue rebuild_tensor(const std::string& f, const c10::IValue& args) {
    const auto a = tuple_elements(args, f.c_str());
    if (a.size() < 4 || !a[0].isTensor()) bad(f + ": unexpected arguments");
    const at::Tensor storage = a[0].toTensor();
    const std::vector<int64_t> size = int_list(a[2]), stride = int_list(a[3]);
    if (size.size() != stride.size()) bad(f + ": size and stride differ in length");
    return storage.as_strided(size, stride, a[1].toInt());
  }

  // (func, type, args, state): a tensor subclass or a tensor with Python attributes; the tensor
  // is func(*args), the rest is Python-only.
  c10::IValue rebuild_from_type(const std::string& f, const c10::IValue& args) {
    const auto a = tuple_elements(args, f.c_str());
    if (a.size() < 3 || !a[0].isString()) bad(f + ": unexpected arguments");
    std::string inner = a[0].toStringRef();
    if (inner.rfind("<global ", 0) != 0) bad(f + ": function is not a global");
    inner = inner.substr(8, inner.size() - 9);
    return reduce(Item{Item::Kind::kGlobal, {}, inner}, Item{Item::Kind::kValue, a[2], {}});
  }

  // torch.device(type[, index]) as "type" or "type:index".
  static c10::IValue device_text(const std::vector<c10::IValue>& a) {
    std::string s = a.empty() ? "" : (a[0].isString() ? a[0].toStringRef() : "?");
    if (a.size() > 1 && a[1].isInt()) {
      // Two appends, not s += ":" + ...: GCC 12 misreads that inlined one (-Wstringop-overflow).
      s += ':';
      s += std::to_string(a[1].toInt());
    }
    return s;
  }

  // _codecs.encode's text holds one code point per byte, UTF-8 encoded by the pickler: the
  // bytes back.
  static std::string latin1_bytes(const std::string& u) {
    std::string out;
    for (size_t i = 0; i < u.size(); ++i) {
      const auto c = static_cast<uint8_t>(u[i]);
      if (c < 0x80 || i + 1 >= u.size()) {
        out.push_back(static_cast<char>(c));
      } else {
        out.push_back(
            static_cast<char>(((c & 0x1f) << 6) | (static_cast<uint8_t>(u[i + 1]) & 0x3f)));
        ++i;
      }
    }
    return out;
  }

  // ('storage', storage_type, key, location, numel) -> a 1-D CPU tensor over the record.
  c10::IValue persistent_load(const c10::IValue& pid) {
    if (!pid.isTuple()) bad("persistent id is not a tuple");
    const std::vector<c10::IValue> a = pid.toTupleRef().elements().vec();
    if (a.size() < 5 || !a[0].isString() || a[0].toStringRef() != "storage") {
      bad("persistent id is not a ('storage', type, key, location, numel) tuple");
    }
    std::string type = a[1].isString() ? a[1].toStringRef() : "?";
    if (type.rfind("<global ", 0) == 0) type = type.substr(8, type.size() - 9);
    const std::string key = a[2].toStringRef();
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    const c10::ScalarType dtype = storage_dtype(type, name_);
    const std::string record = "data/" + key;
    if (!reader_.hasRecord(record)) fail(name_, "tensor record " + record + " is missing");
    const size_t nbytes = reader_.getRecordSize(record);
    const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t numel = static_cast<int64_t>(nbytes) / itemsize;
    if (a[4].isInt() && a[4].toInt() != numel) {
      // numel in the id counts elements of the storage's type; the record must hold them all.
      if (a[4].toInt() * itemsize > static_cast<int64_t>(nbytes)) {
        fail(name_, "tensor record " + record + " is shorter than its storage");
      }
    }
    at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (nbytes > 0) reader_.getRecord(record, t.data_ptr(), nbytes);
    storages_.emplace(key, t);
    return t;
  }

  const char* p_;
  const char* end_;
  std::string name_;
  caffe2::serialize::PyTorchStreamReader& reader_;
  std::vector<Item> stack_;
  std::unordered_map<size_t, Item> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
};

c10::IValue load_from_reader(caffe2::serialize::PyTorchStreamReader& reader,
                             const std::string& name) {
  if (reader.hasRecord("constants.pkl") || reader.hasRecord("code/__torch__.py")) {
    fail(name, "is a TorchScript archive (torch.jit.save), not a torch.save file");
  }
  if (!reader.hasRecord("data.pkl")) fail(name, "has no data.pkl: not a torch.save archive");
  if (reader.hasRecord("byteorder")) {
    auto [ptr, n] = reader.getRecord("byteorder");
    const std::string order(static_cast<const char*>(ptr.get()), n);
    if (order != "little")
      fail(name, "holds " + order + "-endian tensors; only little-endian is supported");
  }
  auto [ptr, n] = reader.getRecord("data.pkl");
  Unpickler u(static_cast<const char*>(ptr.get()), n, name, reader);
  return u.run();
}

// The zip archive of a pickled value, as torch.save lays it out.
std::vector<char> archive_of(const c10::IValue& value) {
  std::vector<char> pickle;
  // torch::pickle_save minus the type tags: it wraps typed containers in
  // torch.jit._pickle.restore_type_tag, a global torch.load(weights_only=True) refuses.
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> zip;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      const char* bytes = static_cast<const char*>(data);
      zip.insert(zip.end(), bytes, bytes + n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                       writer);
  }
  return zip;
}

}  // namespace

c10::IValue load_torch_file(const fs::path& path) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(name, "cannot open");
  char magic[2] = {0, 0};
  in.read(magic, 2);
  if (in.gcount() < 2 || magic[0] != 'P' || magic[1] != 'K') {
    fail(name,
         "not a zip archive: not written by torch.save since PyTorch 1.6 (for the legacy "
         "format, re-save it in Python with torch.save(obj, path))");
  }
  in.seekg(0);
  try {
    caffe2::serialize::PyTorchStreamReader reader(&in);
    return load_from_reader(reader, name);
  } catch (const c10::Error& e) {
    fail(name, std::string("cannot read the archive: ") + e.what_without_backtrace());
  }
}

c10::IValue load_torch_bytes(const std::vector<char>& bytes, const std::string& name) {
  if (bytes.size() < 2 || bytes[0] != 'P' || bytes[1] != 'K') fail(name, "not a zip archive");
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  try {
    caffe2::serialize::PyTorchStreamReader reader(&in);
    return load_from_reader(reader, name);
  } catch (const c10::Error& e) {
    fail(name, std::string("cannot read the archive: ") + e.what_without_backtrace());
  }
}

void save_torch_file(const c10::IValue& value, const fs::path& path) {
  profiler::write_file_atomically(path, archive_of(value));
}

}  // namespace gpufeed::harness
