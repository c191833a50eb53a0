//===- Json.h - the JSON of tensor files and checkpoint indexes ---*- C++ -*-===//
//
// Just what safetensors headers and tdx.index.json need: null, booleans,
// integers, doubles, strings, arrays and objects, parsed strictly and
// printed compactly or indented. The runtime has no LLVM dependency (a
// GPU machine builds it from source with nvcc alone).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_STATEFORMAT_JSON_H
#define TDX_STATEFORMAT_JSON_H

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tdx::rt::json {

class Value;
using Array = std::vector<Value>;
class Object;

class Value {
public:
  enum Kind { Null, Bool, Int, Double, String, ArrayKind, ObjectKind };
  Value() = default;
  Value(bool b) : kind_(Bool), int_(b) {}
  Value(int v) : kind_(Int), int_(v) {}
  Value(long v) : kind_(Int), int_(v) {}
  Value(long long v) : kind_(Int), int_(v) {}
  Value(unsigned v) : kind_(Int), int_(v) {}
  Value(unsigned long v) : kind_(Int), int_(static_cast<int64_t>(v)) {}
  Value(unsigned long long v) : kind_(Int), int_(static_cast<int64_t>(v)) {}
  Value(double v) : kind_(Double), double_(v) {}
  Value(const char *s) : kind_(String), string_(s) {}
  Value(std::string s) : kind_(String), string_(std::move(s)) {}
  Value(Array a);
  Value(Object o);

  Kind kind() const { return kind_; }
  const Object *getAsObject() const { return object_.get(); }
  const Array *getAsArray() const { return array_.get(); }
  std::optional<std::string> getAsString() const;
  std::optional<int64_t> getAsInteger() const;
  std::optional<uint64_t> getAsUINT64() const;
  std::optional<bool> getAsBool() const;
  /// An integer or a double, as a double.
  std::optional<double> getAsNumber() const;

private:
  friend std::string print(const Value &, int);
  Kind kind_ = Null;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::shared_ptr<const Array> array_;
  std::shared_ptr<const Object> object_;
};

/// Keys in sorted order (as printed).
class Object : public std::map<std::string, Value> {
public:
  using std::map<std::string, Value>::map;
  const Value *get(const std::string &key) const;
  std::optional<int64_t> getInteger(const std::string &key) const;
  std::optional<std::string> getString(const std::string &key) const;
  const Array *getArray(const std::string &key) const;
  const Object *getObject(const std::string &key) const;
};

/// The value of `text`; nullopt (with the reason and byte offset in
/// `error`) when it is not exactly one JSON value.
std::optional<Value> parse(const std::string &text, std::string *error = nullptr);

/// Compact with indent < 0, else one member per line indented so.
std::string print(const Value &value, int indent = -1);

} // namespace tdx::rt::json

#endif // TDX_STATEFORMAT_JSON_H
