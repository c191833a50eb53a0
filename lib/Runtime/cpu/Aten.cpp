//===- Aten.cpp - generic ATen calls by schema name -----------------------===//

#include "tdx/Runtime/Runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <stdexcept>

namespace {

c10::TypePtr withoutOptional(const c10::TypePtr &t) {
  return t->kind() == c10::TypeKind::OptionalType
             ? t->castRaw<c10::OptionalType>()->getElementType()
             : t;
}

bool isTensorType(const c10::TypePtr &t) {
  return withoutOptional(t)->kind() == c10::TypeKind::TensorType;
}

/// `v` as the schema type `type` wants it; throws naming the argument.
c10::IValue convert(const std::string &schema, const c10::Argument &a, c10::IValue v) {
  auto fail = [&](const std::string &why) {
    return std::runtime_error("tdx: " + schema + ": argument '" + a.name() + "' " + why);
  };
  if (v.isNone()) {
    if (a.type()->kind() != c10::TypeKind::OptionalType)
      throw fail("is None but the schema does not allow None (type " + a.type()->str() + ")");
    return v;
  }
  c10::TypePtr t = withoutOptional(a.type());
  switch (t->kind()) {
  case c10::TypeKind::DeviceObjType:
    if (v.isString())
      return c10::IValue(c10::Device(v.toStringRef()));
    break;
  case c10::TypeKind::FloatType:
    if (v.isInt())
      return c10::IValue(static_cast<double>(v.toInt()));
    break;
  case c10::TypeKind::ListType: {
    c10::TypePtr e = t->castRaw<c10::ListType>()->getElementType();
    if (e->kind() == c10::TypeKind::TensorType && v.isList()) {
      c10::List<at::Tensor> list;
      for (const c10::IValue &x : v.toListRef()) {
        if (!x.isTensor())
          throw fail("has a None element but the schema takes Tensor[]");
        list.push_back(x.toTensor());
      }
      return c10::IValue(list);
    }
    break;
  }
  default:
    break;
  }
  return v;
}

} // namespace

std::vector<at::Tensor>
tdx::rt::callAten(const std::string &schema, const std::vector<at::Tensor> &tensors,
                  const std::vector<std::pair<std::string, c10::IValue>> &args,
                  const std::vector<std::vector<int64_t>> &shapes) {
  size_t dot = schema.find('.');
  std::string name = schema.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : schema.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle)
    throw std::runtime_error("tdx: no ATen operator " + schema +
                             " in this libtorch; compile the program with the libtorch "
                             "that captured it");
  const c10::FunctionSchema &fs = handle->schema();
  for (const auto &kv : args)
    if (std::none_of(fs.arguments().begin(), fs.arguments().end(),
                     [&](const c10::Argument &a) { return a.name() == kv.first; }))
      throw std::runtime_error("tdx: " + schema + " has no argument '" + kv.first +
                               "'; its schema is " + c10::toString(fs));
  // as_strided reads the storage of its input: in a program that is the
  // value's elements in row-major order from offset 0, whatever view of
  // another value (a transpose, a slice) holds them here.
  bool readsStorage = name == "aten::as_strided" || name == "aten::as_strided_scatter";
  auto operand = [&](const at::Tensor &t) {
    return readsStorage && t.defined() && !(t.is_contiguous() && t.storage_offset() == 0)
               ? t.clone(at::MemoryFormat::Contiguous)
               : t;
  };
  torch::jit::Stack stack;
  size_t next = 0;
  for (const c10::Argument &a : fs.arguments()) {
    auto given = std::find_if(args.begin(), args.end(),
                              [&](const auto &kv) { return kv.first == a.name(); });
    if (given != args.end())
      stack.push_back(convert(schema, a, given->second));
    else if (isTensorType(a.type()) && next < tensors.size())
      stack.push_back(operand(tensors[next++]));
    else if (a.default_value())
      stack.push_back(*a.default_value());
    else
      throw std::runtime_error("tdx: " + schema + ": no value for argument '" + a.name() +
                               "' (the program does not give it and the schema has no "
                               "default); recapture the model with this tdx");
  }
  if (next != tensors.size())
    throw std::runtime_error("tdx: " + schema + ": " + std::to_string(tensors.size()) +
                             " tensor operands but the schema takes " + std::to_string(next));
  try {
    handle->callBoxed(stack);
  } catch (const c10::Error &e) {
    throw std::runtime_error("tdx: " + schema + " failed: " + e.what_without_backtrace());
  }
  std::vector<at::Tensor> out;
  for (const c10::IValue &v : stack) {
    if (v.isTensor()) {
      // A lazily conjugated or negated view (conj, _neg_view), materialized:
      // the program reads its elements as they are stored.
      const at::Tensor &t = v.toTensor();
      out.push_back(t.defined() && (t.is_conj() || t.is_neg()) ? t.resolve_conj().resolve_neg()
                                                               : t);
    } else if (v.isTensorList()) {
      for (const at::Tensor &t : v.toTensorVector())
        out.push_back(t);
    } else {
      throw std::runtime_error("tdx: " + schema + " returned a " + v.tagKind() +
                               ", which a tdx program cannot hold");
    }
  }
  for (size_t i = 0; i < out.size() && i < shapes.size(); ++i) {
    const at::Tensor &t = out[i];
    if (!t.defined() || (shapes[i].size() == 1 && shapes[i][0] == -2))
      continue;
    bool same = t.dim() == static_cast<int64_t>(shapes[i].size());
    for (size_t d = 0; same && d < shapes[i].size(); ++d)
      same = shapes[i][d] < 0 || shapes[i][d] == t.size(static_cast<int64_t>(d));
    if (!same)
      throw std::runtime_error(
          "tdx: " + schema + " returned result " + std::to_string(i) + " of shape " +
          c10::str(t.sizes()) + " where its meta kernel, at capture, gave " +
          c10::str(c10::IntArrayRef(shapes[i])) +
          " (a meta kernel that disagrees with the CPU kernel: a tdx bug, please report it)");
    if (t.numel() > 0 && (!t.has_storage() || !t.storage().data()))
      throw std::runtime_error("tdx: " + schema + " returned result " + std::to_string(i) +
                               " without storage (an ATen ZeroTensor or lazy tensor), which a "
                               "tdx program cannot hold");
  }
  return out;
}

at::Tensor tdx::rt::concat(const std::vector<at::Tensor> &xs, int64_t dim) {
  if (xs.empty())
    return at::cat(xs, dim);
  int64_t rank = xs.front().dim();
  dim = at::maybe_wrap_dim(dim, rank);
  bool interleave = dim == rank - 1;
  at::ScalarType type = xs.front().scalar_type();
  int64_t total = 0;
  for (const at::Tensor &x : xs) {
    interleave &= x.sizes() == xs.front().sizes() && x.size(dim) == 1;
    type = at::promote_types(type, x.scalar_type());
    total += x.dim() == rank ? x.size(dim) : 0;
  }
  if (!interleave)
    return at::cat(xs, dim);
  std::vector<int64_t> shape = xs.front().sizes().vec();
  shape[dim] = total;
  at::Tensor out = at::empty(shape, xs.front().options().dtype(type));
  for (size_t i = 0; i < xs.size(); ++i)
    out.narrow(dim, static_cast<int64_t>(i), 1).copy_(xs[i]);
  return out;
}
