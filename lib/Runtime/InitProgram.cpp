//===- InitProgram.cpp - init programs evaluated element by element -------===//

#include "tdx/Runtime/InitProgram.h"
#include "tdx/Runtime/Kernel.h"
#include "tdx/Runtime/Philox.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

using namespace tdx::rt;

namespace {

constexpr int kMaxRank = 8;

double roundTo(DType t, double v) {
  switch (t) {
  case DType::F32:
    return static_cast<double>(static_cast<float>(v));
  case DType::I64:
  case DType::I32:
    return std::trunc(v);
  case DType::Bool:
    return v != 0.0 ? 1.0 : 0.0;
  default:
    return v;
  }
}

} // namespace

bool tdx::rt::initProgramsMake(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::I64 || t == DType::I32 ||
         t == DType::Bool;
}

namespace {

int64_t linear(const int64_t *index, const std::vector<int64_t> &shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    i = i * shape[d] + index[d];
  return i;
}

} // namespace

InitProgram tdx::rt::withSeed(InitProgram program, uint64_t seed) {
  for (InitProgram::Node &n : program.nodes)
    n.seed ^= seed;
  return program;
}

InitProgram tdx::rt::atCall(InitProgram program, uint64_t call) {
  for (InitProgram::Node &n : program.nodes)
    n.stream += (call + 1) << 32;
  return program;
}

double InitProgram::at(int n, const int64_t *index) const {
  const Node &node = nodes[n];
  uint64_t i = static_cast<uint64_t>(linear(index, node.shape));
  // An operand's index under broadcasting: trailing dims align, size 1 reads 0.
  auto operand = [&](int k) {
    const Node &o = nodes[k];
    int64_t sub[kMaxRank];
    size_t lead = node.shape.size() - o.shape.size();
    for (size_t d = 0; d < o.shape.size(); ++d)
      sub[d] = o.shape[d] == 1 ? 0 : index[d + lead];
    return at(k, sub);
  };
  switch (node.kind) {
  case Empty:
    return 0.0;
  case Full:
    return roundTo(node.dtype, node.p[0]);
  case Arange:
    return roundTo(node.dtype, node.p[0] + static_cast<double>(index[0]) * node.p[1]);
  case Uniform:
    return roundTo(node.dtype, node.p[0] + (node.p[1] - node.p[0]) *
                                               tdx::rng::uniform01(node.seed, node.stream, i));
  case Normal:
    return roundTo(node.dtype, node.p[0] + node.p[1] * tdx::rng::standardNormal(
                                                           node.seed, node.stream, i));
  case TruncNormal:
    return roundTo(node.dtype, tdx::rng::truncNormal(node.seed, node.stream, i, node.p[0],
                                                     node.p[1], node.p[2], node.p[3]));
  case Bernoulli:
    return tdx::rng::uniform01(node.seed, node.stream, i) < node.p[0] ? 1.0 : 0.0;
  case Constant:
    return node.values.size() == 1 ? node.values[0] : node.values[i];
  case Reshape: {
    // Same elements in row-major order: unravel the linear index.
    const Node &o = nodes[node.a];
    int64_t sub[kMaxRank];
    int64_t rest = static_cast<int64_t>(i);
    for (int64_t d = static_cast<int64_t>(o.shape.size()) - 1; d >= 0; --d) {
      sub[d] = rest % o.shape[d];
      rest /= o.shape[d];
    }
    return at(node.a, sub);
  }
  default:
    break;
  }
  switch (node.kind) {
  case Cast:
    return roundTo(node.dtype, at(node.a, index));
  case Expand:
    return operand(node.a);
  case Cmp: {
    double x = operand(node.a), y = operand(node.b);
    bool r[] = {x == y, x != y, x < y, x <= y, x > y, x >= y};
    return r[static_cast<int>(node.p[0])] ? 1.0 : 0.0;
  }
  case Where:
    return roundTo(node.dtype, operand(node.a) != 0 ? operand(node.b) : operand(node.c));
#define TDX_UNARY(Name, fn, aten, linear, ...)                                                    \
  case Name:                                                                                 \
    return roundTo(node.dtype, ::tdx::kern::fn(at(node.a, index)));
#define TDX_BINARY(Name, fn, aten, ...)                                                           \
  case Name:                                                                                 \
    return roundTo(node.dtype, ::tdx::kern::fn(operand(node.a), operand(node.b)));
#include "tdx/Runtime/ElementwiseOps.def"
  default:
    break;
  }
  throw std::runtime_error("tdx: init program node of unknown kind " +
                           std::to_string(static_cast<int>(node.kind)));
}

std::vector<InitProgram> tdx::rt::initPrograms(const InitNodeData *nodes,
                                               const int (*ranges)[2], int programs) {
  std::vector<InitProgram> out(programs);
  for (int k = 0; k < programs; ++k)
    for (int i = ranges[k][0]; i < ranges[k][0] + ranges[k][1]; ++i) {
      const InitNodeData &d = nodes[i];
      InitProgram::Node n;
      n.kind = d.kind;
      n.dtype = d.dtype;
      n.shape.assign(d.shape, d.shape + d.rank);
      n.a = d.a;
      n.b = d.b;
      std::copy(d.p, d.p + 4, n.p);
      n.seed = d.seed;
      n.stream = d.stream;
      n.values.assign(d.values, d.values + d.count);
      n.c = d.c;
      out[k].nodes.push_back(std::move(n));
    }
  return out;
}

const char *InitProgram::kindName(Kind kind) {
  switch (kind) {
#define TDX_KIND(k)                                                                        \
  case k:                                                                                  \
    return #k;
    TDX_INIT_KINDS(TDX_KIND)
#undef TDX_KIND
#define TDX_UNARY(Name, fn, aten, linear, ...)                                                    \
  case Name:                                                                                 \
    return #Name;
#define TDX_BINARY(Name, fn, aten, ...)                                                           \
  case Name:                                                                                 \
    return #Name;
#include "tdx/Runtime/ElementwiseOps.def"
  }
  return "?";
}

void InitProgram::fillBox(const std::vector<int64_t> &offset, const std::vector<int64_t> &size,
                          void *out) const {
  const Node &r = result();
  if (r.shape.size() > static_cast<size_t>(kMaxRank) || offset.size() != r.shape.size() ||
      size.size() != r.shape.size())
    throw std::runtime_error("tdx: an init program's box does not match its rank (<= 8)");
  int64_t count = 1;
  for (int64_t s : size)
    count *= s;
  int64_t local[kMaxRank] = {}, global[kMaxRank] = {};
  char *dst = static_cast<char *>(out);
  int64_t item = dtypeSize(r.dtype);
  for (int64_t n = 0; n < count; ++n) {
    for (size_t d = 0; d < size.size(); ++d)
      global[d] = offset[d] + local[d];
    double v = at(static_cast<int>(nodes.size()) - 1, global);
    char *e = dst + n * item;
    switch (r.dtype) {
    case DType::F32: { float f = static_cast<float>(v); std::memcpy(e, &f, 4); break; }
    case DType::F64: std::memcpy(e, &v, 8); break;
    case DType::I64: { int64_t x = static_cast<int64_t>(v); std::memcpy(e, &x, 8); break; }
    case DType::I32: { int32_t x = static_cast<int32_t>(v); std::memcpy(e, &x, 4); break; }
    case DType::Bool: *e = v != 0.0; break;
    default:
      throw std::runtime_error(std::string("tdx: init programs make F32, F64, I64, I32 and "
                                           "BOOL tensors, not ") + dtypeName(r.dtype));
    }
    for (int64_t d = static_cast<int64_t>(size.size()) - 1; d >= 0; --d) {
      if (++local[d] < size[d])
        break;
      local[d] = 0;
    }
  }
}
