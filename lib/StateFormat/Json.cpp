//===- Json.cpp - the JSON of tensor files and checkpoint indexes ---------===//

#include "tdx/StateFormat/Json.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

using namespace tdx::rt::json;

Value::Value(Array a) : kind_(ArrayKind), array_(std::make_shared<const Array>(std::move(a))) {}
Value::Value(Object o) : kind_(ObjectKind), object_(std::make_shared<const Object>(std::move(o))) {}

std::optional<std::string> Value::getAsString() const {
  if (kind_ != String)
    return std::nullopt;
  return string_;
}

std::optional<int64_t> Value::getAsInteger() const {
  if (kind_ == Int)
    return int_;
  if (kind_ == Double && std::floor(double_) == double_ && std::fabs(double_) < 9.2e18)
    return static_cast<int64_t>(double_);
  return std::nullopt;
}

std::optional<bool> Value::getAsBool() const {
  if (kind_ == Bool)
    return int_ != 0;
  return std::nullopt;
}

std::optional<double> Value::getAsNumber() const {
  if (kind_ == Int)
    return static_cast<double>(int_);
  if (kind_ == Double)
    return double_;
  return std::nullopt;
}

std::optional<uint64_t> Value::getAsUINT64() const {
  std::optional<int64_t> v = getAsInteger();
  if (!v || *v < 0)
    return std::nullopt;
  return static_cast<uint64_t>(*v);
}

const Value *Object::get(const std::string &key) const {
  auto it = find(key);
  return it == end() ? nullptr : &it->second;
}
std::optional<int64_t> Object::getInteger(const std::string &key) const {
  const Value *v = get(key);
  return v ? v->getAsInteger() : std::nullopt;
}
std::optional<std::string> Object::getString(const std::string &key) const {
  const Value *v = get(key);
  return v ? v->getAsString() : std::nullopt;
}
const Array *Object::getArray(const std::string &key) const {
  const Value *v = get(key);
  return v ? v->getAsArray() : nullptr;
}
const Object *Object::getObject(const std::string &key) const {
  const Value *v = get(key);
  return v ? v->getAsObject() : nullptr;
}

namespace {

struct Parser {
  const std::string &s;
  size_t i = 0;
  std::string error;

  bool fail(const std::string &what) {
    if (error.empty())
      error = what + " at byte " + std::to_string(i);
    return false;
  }
  void space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
      ++i;
  }
  bool literal(const char *word) {
    size_t n = std::char_traits<char>::length(word);
    if (s.compare(i, n, word) != 0)
      return fail("unexpected character");
    i += n;
    return true;
  }
  static void utf8(std::string &out, uint32_t c) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  bool hex4(uint32_t &out) {
    if (i + 4 > s.size())
      return fail("truncated \\u escape");
    out = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s[i++];
      out <<= 4;
      if (c >= '0' && c <= '9')
        out |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        out |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        out |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return fail("bad \\u escape");
    }
    return true;
  }
  bool string(std::string &out) {
    ++i; // "
    while (true) {
      if (i >= s.size())
        return fail("unterminated string");
      char c = s[i++];
      if (c == '"')
        return true;
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size())
        return fail("unterminated string");
      switch (char e = s[i++]) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        uint32_t c1;
        if (!hex4(c1))
          return false;
        if (c1 >= 0xd800 && c1 < 0xdc00 && s.compare(i, 2, "\\u") == 0) {
          i += 2;
          uint32_t c2;
          if (!hex4(c2))
            return false;
          c1 = 0x10000 + ((c1 - 0xd800) << 10) + (c2 - 0xdc00);
        }
        utf8(out, c1);
        break;
      }
      default:
        return fail("bad escape");
      }
    }
  }
  bool number(Value &out) {
    size_t start = i;
    bool integral = true;
    if (s[i] == '-')
      ++i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' ||
                            s[i] == 'e' || s[i] == 'E' || s[i] == '+' || s[i] == '-')) {
      integral &= std::isdigit(static_cast<unsigned char>(s[i])) != 0;
      ++i;
    }
    std::string text = s.substr(start, i - start);
    if (text.empty() || text == "-")
      return fail("bad number");
    char *end = nullptr;
    if (integral) {
      errno = 0;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == 0 && *end == 0) {
        out = Value(v);
        return true;
      }
    }
    double d = std::strtod(text.c_str(), &end);
    if (*end != 0)
      return fail("bad number");
    out = Value(d);
    return true;
  }
  bool value(Value &out, int depth) {
    if (depth > 64)
      return fail("nesting too deep");
    space();
    if (i >= s.size())
      return fail("unexpected end");
    char c = s[i];
    if (c == '{') {
      ++i;
      Object o;
      space();
      if (i < s.size() && s[i] == '}') {
        ++i;
        out = Value(std::move(o));
        return true;
      }
      while (true) {
        space();
        if (i >= s.size() || s[i] != '"')
          return fail("expected a key");
        std::string key;
        if (!string(key))
          return false;
        space();
        if (i >= s.size() || s[i++] != ':')
          return fail("expected ':'");
        Value v;
        if (!value(v, depth + 1))
          return false;
        if (!o.emplace(std::move(key), std::move(v)).second)
          return fail("duplicate key");
        space();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') {
          ++i;
          out = Value(std::move(o));
          return true;
        }
        return fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++i;
      Array a;
      space();
      if (i < s.size() && s[i] == ']') {
        ++i;
        out = Value(std::move(a));
        return true;
      }
      while (true) {
        Value v;
        if (!value(v, depth + 1))
          return false;
        a.push_back(std::move(v));
        space();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') {
          ++i;
          out = Value(std::move(a));
          return true;
        }
        return fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      std::string text;
      if (!string(text))
        return false;
      out = Value(std::move(text));
      return true;
    }
    if (c == 't') {
      out = Value(true);
      return literal("true");
    }
    if (c == 'f') {
      out = Value(false);
      return literal("false");
    }
    if (c == 'n') {
      out = Value();
      return literal("null");
    }
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c)))
      return number(out);
    return fail("unexpected character");
  }
};

void quote(std::string &out, const std::string &text) {
  out += '"';
  for (char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
  }
  out += '"';
}

} // namespace

std::optional<Value> tdx::rt::json::parse(const std::string &text, std::string *error) {
  Parser p{text};
  Value v;
  bool ok = p.value(v, 0);
  if (ok) {
    p.space();
    if (p.i != text.size())
      ok = p.fail("trailing characters");
  }
  if (!ok) {
    if (error)
      *error = p.error;
    return std::nullopt;
  }
  return v;
}

std::string tdx::rt::json::print(const Value &v, int indent) {
  std::string out;
  auto newline = [&](int depth) {
    if (indent >= 0) {
      out += '\n';
      out.append(static_cast<size_t>(indent * depth), ' ');
    }
  };
  std::function<void(const Value &, int)> emit = [&](const Value &x, int depth) {
    switch (x.kind()) {
    case Value::Null:
      out += "null";
      break;
    case Value::Bool:
      out += x.int_ ? "true" : "false";
      break;
    case Value::Int:
      out += std::to_string(x.int_);
      break;
    case Value::Double: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", x.double_);
      out += buf;
      break;
    }
    case Value::String:
      quote(out, x.string_);
      break;
    case Value::ArrayKind: {
      // An array of scalars (a shape, an offset) stays on one line.
      bool flat = true;
      for (const Value &e : *x.array_)
        flat &= e.kind() != Value::ArrayKind && e.kind() != Value::ObjectKind;
      out += '[';
      bool first = true;
      for (const Value &e : *x.array_) {
        if (!first)
          out += flat && indent >= 0 ? ", " : ",";
        first = false;
        if (!flat)
          newline(depth + 1);
        emit(e, depth + 1);
      }
      if (!flat && !x.array_->empty())
        newline(depth);
      out += ']';
      break;
    }
    case Value::ObjectKind: {
      out += '{';
      bool first = true;
      for (const auto &[k, e] : *x.object_) {
        if (!first)
          out += ',';
        first = false;
        newline(depth + 1);
        quote(out, k);
        out += indent >= 0 ? ": " : ":";
        emit(e, depth + 1);
      }
      if (!x.object_->empty())
        newline(depth);
      out += '}';
      break;
    }
    }
  };
  emit(v, 0);
  return out;
}
