//===- AtenArgs.cuh - the arguments of generic aten ops on CUDA -*- CUDA -*-===//
//
// Private to lib/Runtime/cuda: reading a generic op's named arguments and
// tensor operands (the rows of tdx/Runtime/cuda/AtenOps.def, implemented in
// Aten.cu and Conv.cu), with errors that name the op.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_RUNTIME_CUDA_ATENARGS_CUH
#define TDX_LIB_RUNTIME_CUDA_ATENARGS_CUH

#include "tdx/Runtime/cuda/Runtime.h"

#include <stdexcept>
#include <string>

namespace tdx::cu::detail {

inline const Arg &arg(const Args &args, const char *name, const char *op) {
  auto it = args.find(name);
  if (it == args.end())
    throw std::runtime_error(std::string("tdx: ") + op + " has no argument '" + name +
                             "' (a program emitted for another libtorch?)");
  return it->second;
}
inline int64_t intArg(const Args &args, const char *name, const char *op) {
  const Arg &a = arg(args, name, op);
  if (a.kind != Arg::Int)
    throw std::runtime_error(std::string("tdx: ") + op + "'s '" + name + "' is not an int");
  return a.i;
}
/// A float argument (an int where Python passed one).
inline double doubleArg(const Args &args, const char *name, const char *op) {
  const Arg &a = arg(args, name, op);
  if (a.kind != Arg::Double && a.kind != Arg::Int)
    throw std::runtime_error(std::string("tdx: ") + op + "'s '" + name + "' is not a number");
  return a.kind == Arg::Double ? a.d : static_cast<double>(a.i);
}
inline bool boolArg(const Args &args, const char *name, const char *op) {
  const Arg &a = arg(args, name, op);
  if (a.kind != Arg::Bool)
    throw std::runtime_error(std::string("tdx: ") + op + "'s '" + name + "' is not a bool");
  return a.b;
}
inline const std::vector<int64_t> &intsArg(const Args &args, const char *name, const char *op) {
  const Arg &a = arg(args, name, op);
  if (a.kind != Arg::Ints)
    throw std::runtime_error(std::string("tdx: ") + op + "'s '" + name + "' is not a list");
  return a.ints;
}
/// An output_mask of `n` bools.
inline const std::vector<bool> &maskArg(const Args &args, const char *op, size_t n) {
  const Arg &a = arg(args, "output_mask", op);
  if (a.kind != Arg::Bools || a.bools.size() != n)
    throw std::runtime_error(std::string("tdx: ") + op + "'s output_mask is not " +
                             std::to_string(n) + " bools");
  return a.bools;
}
/// Whether the optional tensor argument `name` was given (None is Arg()).
inline bool given(const Args &args, const char *name) {
  auto it = args.find(name);
  return it == args.end() || it->second.kind != Arg::None;
}
inline void expectTensors(const std::vector<Tensor> &tensors, size_t n, const char *op) {
  if (tensors.size() != n)
    throw std::runtime_error(std::string("tdx: ") + op + " takes " + std::to_string(n) +
                             " tensors here, not " + std::to_string(tensors.size()));
}
/// The operands of a schema whose first `leading` tensors are required and
/// whose next ones are the optional tensors `names` (in schema order): the
/// tensors as given, an undefined Tensor for each None; the count checked.
inline std::vector<Tensor> schemaTensors(const std::vector<Tensor> &tensors, const Args &args,
                                         size_t leading, std::initializer_list<const char *> names,
                                         const char *op) {
  size_t count = leading;
  for (const char *name : names)
    count += given(args, name);
  expectTensors(tensors, count, op);
  std::vector<Tensor> out(tensors.begin(), tensors.begin() + leading);
  size_t next = leading;
  for (const char *name : names)
    out.push_back(given(args, name) ? tensors[next++] : Tensor());
  return out;
}
/// A dense copy of an optional tensor (undefined stays undefined).
inline Tensor dense(const Tensor &t) { return t.defined() ? t.contiguous() : Tensor(); }
template <class T> const T *ptr(const Tensor &t) { return static_cast<const T *>(t.data()); }
template <class T> T *out(const Tensor &t) { return static_cast<T *>(t.data()); }

} // namespace tdx::cu::detail

#endif // TDX_LIB_RUNTIME_CUDA_ATENARGS_CUH
