//===- ShareParts.cpp - one function for parts that differ in constants --===//
//
// Repeated layers emit the same parts (tdx-split-parts cuts where the ops
// say, so a layer's parts repeat in every layer): the same code, with other
// local names, state names, carry slots and arena offsets. Each group of
// such parts becomes one function that takes what differs as arrays; every
// part of the group calls it with its own values. The C++ compiler then
// compiles a layer's code once, not once per layer.
//
//===----------------------------------------------------------------------===//

#include "tdx/Target/Cpp.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"

#include <map>
#include <string>
#include <vector>

using namespace mlir;

namespace {

enum class Kind { Ident, Number, String, Other };

struct Token {
  Kind kind;
  std::string text;
};

std::vector<Token> tokenize(llvm::StringRef s) {
  std::vector<Token> out;
  size_t i = 0;
  auto other = [&](size_t from, size_t to) {
    if (!out.empty() && out.back().kind == Kind::Other)
      out.back().text += s.slice(from, to).str();
    else
      out.push_back({Kind::Other, s.slice(from, to).str()});
  };
  while (i < s.size()) {
    char c = s[i];
    size_t j = i + 1;
    if (llvm::isAlpha(c) || c == '_') {
      while (j < s.size() && (llvm::isAlnum(s[j]) || s[j] == '_'))
        ++j;
      out.push_back({Kind::Ident, s.slice(i, j).str()});
    } else if (llvm::isDigit(c)) {
      // 12, 1.5e-05, 0x7f, 3ull: digits, then what a literal continues with.
      while (j < s.size() && (llvm::isAlnum(s[j]) || s[j] == '.' ||
                              ((s[j] == '+' || s[j] == '-') && (s[j - 1] == 'e' || s[j - 1] == 'E') &&
                               !s.slice(i, j).starts_with("0x"))))
        ++j;
      out.push_back({Kind::Number, s.slice(i, j).str()});
    } else if (c == '"') {
      while (j < s.size() && s[j] != '"')
        j += s[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, s.size());
      out.push_back({Kind::String, s.slice(i, j).str()});
    } else {
      other(i, j);
    }
    i = j;
  }
  return out;
}

/// A local of the emitted step: one lowercase letter and digits (v12, r3,
/// c7), not a namespace (c10::).
bool isLocal(const std::vector<Token> &tokens, size_t i) {
  const std::string &id = tokens[i].text;
  return tokens[i].kind == Kind::Ident && id.size() > 1 && llvm::isLower(id[0]) &&
         llvm::all_of(llvm::StringRef(id).drop_front(), llvm::isDigit) &&
         !(i + 1 < tokens.size() && llvm::StringRef(tokens[i + 1].text).starts_with("::"));
}

/// Locals renamed by first appearance, per leading letter (v0, v1, r0, ...).
struct Renamer {
  llvm::StringMap<std::string> names;
  std::map<char, int> next;
  const std::string &operator()(const std::string &local) {
    auto [it, fresh] = names.try_emplace(local);
    if (fresh)
      it->second = std::string(1, local[0]) + std::to_string(next[local[0]]++);
    return it->second;
  }
};

struct Part {
  size_t begin, end; // the function's text in the body, header included
  std::string name, header;
  std::vector<Token> tokens;
  std::string key; // the tokens with locals renamed and literals blanked
  std::vector<std::string> literals;
};

/// Which array a differing literal goes to.
char arrayOf(const Token &t) {
  if (t.kind == Kind::String)
    return 'S';
  llvm::StringRef n(t.text);
  if (n.starts_with("0x"))
    return n.contains_insensitive("u") ? 'U' : 'I';
  if (n.contains('.') || n.contains_insensitive("e"))
    return 'F';
  return n.contains_insensitive("u") ? 'U' : 'I';
}

} // namespace

void mlir::tdx::shareParts(std::string &body, int64_t minBytes) {
  static const llvm::StringRef kHead = "static std::vector<T::Tensor> ";
  static const llvm::StringRef kArgs =
      "(Context &ctx, State &s, const std::vector<T::Tensor> &in, uint64_t call, "
      "T::Tensor *carry, int64_t *handles) {\n";
  std::vector<Part> parts;
  for (size_t at = body.find(kHead); at != std::string::npos; at = body.find(kHead, at + 1)) {
    if (at && body[at - 1] != '\n')
      continue;
    size_t open = body.find('(', at);
    size_t line = body.find('\n', at);
    if (open == std::string::npos || line == std::string::npos ||
        llvm::StringRef(body).slice(open, line + 1) != kArgs)
      continue;
    size_t close = body.find("\n}\n", line);
    if (close == std::string::npos)
      break;
    Part p;
    p.begin = at;
    p.end = close + 3;
    p.name = body.substr(at + kHead.size(), open - at - kHead.size());
    p.header = body.substr(at, line + 1 - at);
    p.tokens = tokenize(llvm::StringRef(body).slice(line + 1, close + 1));
    Renamer rename;
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      const Token &t = p.tokens[i];
      if (isLocal(p.tokens, i)) {
        p.key += rename(t.text);
      } else if (t.kind == Kind::Number || t.kind == Kind::String) {
        p.key += t.kind == Kind::Number ? "\x01" : "\x02";
        p.literals.push_back(t.text);
      } else {
        p.key += t.text;
      }
    }
    parts.push_back(std::move(p));
  }
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i].key.size() >= static_cast<size_t>(minBytes))
      groups[parts[i].key].push_back(i);
  // The new text of each part (by its index), and the shared functions,
  // which go where the first part was.
  std::map<size_t, std::string> replaced;
  std::string shared;
  int count = 0;
  for (auto &[key, members] : groups) {
    if (members.size() < 2)
      continue;
    const Part &first = parts[members.front()];
    std::string fn = first.name + "_shared" + std::to_string(count++);
    // Literal k: the same in every member (kept), or an entry of an array.
    std::vector<std::pair<char, int>> slot(first.literals.size(), {0, -1});
    std::map<char, int> sizes;
    size_t lit = 0;
    for (const Token &t : first.tokens) {
      if (t.kind != Kind::Number && t.kind != Kind::String)
        continue;
      bool same = llvm::all_of(members, [&](size_t m) {
        return parts[m].literals[lit] == first.literals[lit];
      });
      if (!same) {
        char array = arrayOf(t);
        slot[lit] = {array, sizes[array]++};
      }
      ++lit;
    }
    std::string text = "static std::vector<T::Tensor> " + fn +
                       "(Context &ctx, State &s, const std::vector<T::Tensor> &in, uint64_t call, "
                       "T::Tensor *carry, int64_t *handles, const int64_t *I, const uint64_t *U, "
                       "const double *F, const char *const *S) {\n"
                       "  (void)I;\n  (void)U;\n  (void)F;\n  (void)S;\n";
    Renamer rename;
    lit = 0;
    for (size_t i = 0; i < first.tokens.size(); ++i) {
      const Token &t = first.tokens[i];
      if (isLocal(first.tokens, i)) {
        text += rename(t.text);
      } else if (t.kind == Kind::Number || t.kind == Kind::String) {
        auto [array, index] = slot[lit++];
        text += index < 0 ? t.text : std::string(1, array) + "[" + std::to_string(index) + "]";
      } else {
        text += t.text;
      }
    }
    shared += text + "}\n\n";
    for (size_t m : members) {
      const Part &p = parts[m];
      std::map<char, std::vector<std::string>> values;
      for (size_t k = 0; k < slot.size(); ++k)
        if (slot[k].second >= 0)
          values[slot[k].first].push_back(p.literals[k]);
      std::string call = p.header;
      static const std::pair<char, const char *> arrays[] = {
          {'I', "int64_t"}, {'U', "uint64_t"}, {'F', "double"}, {'S', "char *const"}};
      for (auto [array, type] : arrays)
        if (!values[array].empty())
          call += std::string("  static const ") + type + " " + array + "[] = {" +
                  llvm::join(values[array], ", ") + "};\n";
      call += "  return " + fn + "(ctx, s, in, call, carry, handles";
      for (auto [array, type] : arrays)
        call += values[array].empty() ? ", nullptr" : std::string(", ") + array;
      call += ");\n}\n";
      replaced[m] = call;
    }
  }
  if (replaced.empty())
    return;
  std::string out;
  size_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    out.append(body, at, parts[i].begin - at);
    if (i == 0)
      out += shared;
    auto it = replaced.find(i);
    out += it != replaced.end() ? it->second
                                : body.substr(parts[i].begin, parts[i].end - parts[i].begin);
    at = parts[i].end;
  }
  out.append(body, at, std::string::npos);
  body = std::move(out);
}
