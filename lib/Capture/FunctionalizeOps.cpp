//===- FunctionalizeOps.cpp - recorded ops as tdx ops -----------------------===//
//
// The ops capture knows by name (creation, random init, copies, views) and
// the dispatch of each recorded op (Functionalizer::run, handle): a first-class op, a view, a write
// through a view, or a generic tdx.aten (Functionalizer.h).
//
//===----------------------------------------------------------------------===//

#include "Functionalizer.h"

#include "llvm/ADT/ScopeExit.h"

#include <torch/csrc/jit/runtime/operator.h>

#include <unordered_set>

using ::tdx::capture::CaptureError;
using ::tdx::capture::RecordedOp;

namespace tdx::capture::detail {

namespace {

bool sameArguments(const c10::FunctionSchema &a, const c10::FunctionSchema &b) {
  if (a.arguments().size() != b.arguments().size())
    return false;
  for (size_t i = 0; i < a.arguments().size(); ++i)
    if (a.arguments()[i].name() != b.arguments()[i].name() ||
        a.arguments()[i].type()->str() != b.arguments()[i].type()->str())
      return false;
  return true;
}

/// The functional variant of the in-place op `fs` (name_): the overload of
/// name with the same arguments, when libtorch has one (pow_.Scalar's is
/// pow.Tensor_Scalar; pow.Scalar takes a Scalar base), else `fs` itself.
std::string functionalVariant(const c10::FunctionSchema &fs) {
  const std::string &name = fs.name();
  std::string full = name + (fs.overload_name().empty() ? "" : "." + fs.overload_name());
  if (name.empty() || name.back() != '_')
    return full;
  std::string base = name.substr(0, name.size() - 1);
  for (const auto &candidate : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(base))) {
    const c10::FunctionSchema &s = candidate->schema();
    if (sameArguments(s, fs))
      return base + (s.overload_name().empty() ? "" : "." + s.overload_name());
  }
  return full;
}

} // namespace

Value Functionalizer::functional(const RecordedOp &op, const at::Tensor &out) {
  const std::string &n = op.name;
  const auto &a = op.arguments;
  // Complex tensors have no first-class ops (no kernels): their ops stay
  // generic and run through ATen.
  if (out.is_complex() || llvm::any_of(a, [](const c10::IValue &v) {
        return v.isTensor() && v.toTensor().defined() && v.toTensor().is_complex();
      }))
    return {};
  RankedTensorType type = tensorType(b, out);
  auto key = [&]() {
    return std::make_pair(b.getI64IntegerAttr(seed), b.getI64IntegerAttr(stream++));
  };
  if (n == "aten::empty" || n == "aten::empty_like" || n == "aten::empty_strided" ||
      n == "aten::new_empty" || n == "aten::new_empty_strided")
    return EmptyOp::create(b, loc, type);
  // _efficientzerotensor (autograd's zero gradients) has no storage in ATen.
  if (n == "aten::zeros" || n == "aten::zeros_like" || n == "aten::zero_" ||
      n == "aten::new_zeros" || n == "aten::_efficientzerotensor")
    return full(0.0, type);
  if (n == "aten::ones" || n == "aten::ones_like" || n == "aten::new_ones")
    return full(1.0, type);
  if (n == "aten::fill_" && a[1].isScalar())
    return full(a[1].toScalar().toDouble(), type);
  if (n == "aten::fill_" && a[1].isTensor())
    return fit(read(a[1].toTensor()), type);
  if ((n == "aten::full" || n == "aten::new_full") && a[1].isScalar())
    return full(a[1].toScalar().toDouble(), type);
  if (n == "aten::full_like")
    return full(a[1].toScalar().toDouble(), type);
  if (n == "aten::uniform_") {
    auto [s, k] = key();
    return UniformOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()),
                             b.getF64FloatAttr(a[2].toDouble()), s, k,
                             DenseI64ArrayAttr());
  }
  if (n == "aten::normal_") {
    auto [s, k] = key();
    return NormalOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()),
                            b.getF64FloatAttr(a[2].toDouble()), s, k,
                             DenseI64ArrayAttr());
  }
  // torch.nn.init.trunc_normal_ (python/tdx/deferred.py records it whole).
  if (n == "tdx::trunc_normal_") {
    auto [s, k] = key();
    return TruncNormalOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()),
                                 b.getF64FloatAttr(a[2].toDouble()),
                                 b.getF64FloatAttr(a[3].toDouble()),
                                 b.getF64FloatAttr(a[4].toDouble()), s, k, DenseI64ArrayAttr());
  }
  if (n == "aten::rand" || n == "aten::rand_like") {
    auto [s, k] = key();
    return UniformOp::create(b, loc, type, b.getF64FloatAttr(0.0), b.getF64FloatAttr(1.0), s, k,
                             DenseI64ArrayAttr());
  }
  // Training-mode dropout's mask (torch.empty_like(x).bernoulli_(1 - p)).
  if ((n == "aten::bernoulli_" && op.overload == "float") ||
      (n == "aten::bernoulli" && op.overload == "p")) {
    auto [s, k] = key();
    return BernoulliOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()), s, k,
                             DenseI64ArrayAttr());
  }
  if (n == "aten::randn" || n == "aten::randn_like") {
    auto [s, k] = key();
    return NormalOp::create(b, loc, type, b.getF64FloatAttr(0.0), b.getF64FloatAttr(1.0), s, k,
                             DenseI64ArrayAttr());
  }
  if (n == "aten::arange" && type.getRank() == 1) {
    double start = 0, end, step = 1;
    if (op.overload.empty()) {
      end = a[0].toScalar().toDouble();
    } else {
      start = a[0].toScalar().toDouble();
      end = a[1].toScalar().toDouble();
      if (op.overload == "start_step")
        step = a[2].toScalar().toDouble();
    }
    return ArangeOp::create(b, loc, type, b.getF64FloatAttr(start), b.getF64FloatAttr(end),
                            b.getF64FloatAttr(step));
  }
  if (n == "aten::copy_")
    return fit(read(a[1].toTensor()), type);
  if (n == "aten::clone" || n == "aten::contiguous")
    return read(a[0].toTensor());
  if ((n == "aten::to" || n == "aten::_to_copy") && a[0].isTensor())
    return fit(read(a[0].toTensor()), type);
  if (n == "aten::_unsafe_view" || n == "aten::reshape" || n == "aten::view") {
    Value x = read(a[0].toTensor());
    if (cast<RankedTensorType>(x.getType()).getElementType() == type.getElementType())
      return ReshapeOp::create(b, loc, type, x, b.getDenseI64ArrayAttr(type.getShape()));
  }
  // Everything else is a generic tdx.aten op, raised to first-class ops
  // by tdx-raise-aten (passes/RaiseAten.cpp) when capture ends.
  return {};
}

void Functionalizer::run(const std::vector<RecordedOp> &ops, const std::vector<at::Tensor> &outputs) {
  // What later ops read: a fused form that drops an op's auxiliary results
  // (a loss's total weight, a norm's mean and rstd) is taken only when
  // nothing reads them (a backward does).
  for (const at::Tensor &t : outputs)
    read_.insert(t.unsafeGetTensorImpl());
  for (const RecordedOp &op : ops)
    forEachTensor(op.arguments,
                  [&](const at::Tensor &t) { read_.insert(t.unsafeGetTensorImpl()); });
  // Each op is emitted with its tensors' metadata as it was when the op
  // ran (an in-place view op changes it later); the final metadata is put
  // back after.
  std::vector<TensorMeta> final;
  std::unordered_set<c10::TensorImpl *> saved;
  for (const RecordedOp &op : ops)
    for (const TensorMeta &m : op.resultMeta)
      if (saved.insert(m.impl).second)
        final.push_back(TensorMeta{m.impl, m.impl->sizes().vec(), m.impl->strides().vec(),
                                   m.impl->storage_offset()});
  auto restore = [](const TensorMeta &m) {
    if (m.impl->sizes() != c10::IntArrayRef(m.sizes) ||
        m.impl->strides() != c10::IntArrayRef(m.strides) ||
        m.impl->storage_offset() != m.offset)
      m.impl->set_sizes_and_strides(m.sizes, m.strides, m.offset);
  };
  llvm::scope_exit putBack([&] {
    for (const TensorMeta &m : final)
      restore(m);
  });
  for (const RecordedOp &op : ops) {
    for (const TensorMeta &m : op.resultMeta)
      restore(m);
    current = fullName(op);
    handle(op);
  }
  current = "the module";
}

void Functionalizer::handle(const RecordedOp &op) {
  if (op.name == "tdx::constant") {
    const at::Tensor &fake = op.results[0].toTensor();
    define(fake, constant(op.arguments[0].toTensor(), tensorType(b, fake)));
    return;
  }
  if (op.name == "tdx::alias" || op.name == "tdx::set_data") {
    bool isAlias = op.name == "tdx::alias";
    const at::Tensor &base = op.arguments[isAlias ? 0 : 1].toTensor();
    const at::Tensor &t = isAlias ? op.results[0].toTensor() : op.arguments[0].toTensor();
    if (base.unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
      return;
    View v{base, nullptr, t.sizes().vec(), t.strides().vec(), t.storage_offset()};
    if (isAlias) {
      v.sizes = op.arguments[1].toIntVector();
      v.strides = op.arguments[2].toIntVector();
      v.offset = op.arguments[3].toInt();
    }
    views[t.unsafeGetTensorImpl()] = v;
    cur.erase(t.unsafeGetTensorImpl());
    return;
  }
  const c10::FunctionSchema &fs = schemaOf(op);
  // Pieces: split, split_with_sizes, chunk, unbind.
  if ((op.name == "aten::split" || op.name == "aten::split_with_sizes" ||
       op.name == "aten::chunk" || op.name == "aten::unbind" ||
       op.name == "aten::unsafe_split") &&
      op.results.size() == 1 && op.results[0].isTensorList()) {
    const at::Tensor &self = op.arguments[0].toTensor();
    int64_t dim = op.name == "aten::unbind" ? op.arguments[1].toInt() : op.arguments[2].toInt();
    dim = *normalizeDim(dim, self.dim());
    int64_t start = 0;
    for (const at::Tensor &piece : op.results[0].toTensorVector()) {
      View v{self, nullptr, {}, {}, 0};
      v.sliceDim = dim;
      v.sliceStart = start;
      v.squeeze = op.name == "aten::unbind";
      int64_t len = v.squeeze ? 1 : piece.size(dim);
      v.sliceEnd = start + len;
      start += len;
      views[piece.unsafeGetTensorImpl()] = v;
      cur.erase(piece.unsafeGetTensorImpl());
    }
    return;
  }
  // cross_entropy reaches the fake backend as log_softmax + nll_loss:
  // one tdx.cross_entropy again (its sharding rule knows the classes).
  if (op.name == "aten::nll_loss_forward" && op.results.size() == 2 &&
      (op.arguments[2].isNone() ||
       (op.arguments[2].isTensor() && !op.arguments[2].toTensor().defined()))) {
    Value logp = read(op.arguments[0].toTensor());
    auto ls = logp.getDefiningOp<AtenOp>();
    auto lt = cast<RankedTensorType>(logp.getType());
    int64_t classDim = lt.getRank() == 1 ? 0 : 1;
    auto lsDim = ls && ls.getArgsAttr() ? ls.getArgsAttr().getAs<IntegerAttr>("dim") : IntegerAttr();
    if (ls && (ls.getSchema() == "aten::_log_softmax" || ls.getSchema() == "aten::log_softmax.int") &&
        ls->getNumOperands() == 1 && ls.getOperand(0).getType() == lt && lsDim &&
        normalizeDim(lsDim.getInt(), lt.getRank()) == classDim) {
      static const LossReduction reductions[] = {LossReduction::none, LossReduction::mean,
                                                 LossReduction::sum};
      int64_t r = op.arguments[3].toInt();
      if (r >= 0 && r <= 2) {
        const at::Tensor &out = op.results[0].toTensor();
        Value target = read(op.arguments[1].toTensor());
        auto loss = [&](LossReduction reduction) {
          return CrossEntropyOp::create(
              b, loc, tensorType(b, out), ls.getOperand(0), target,
              LossReductionAttr::get(b.getContext(), reduction),
              b.getI64IntegerAttr(op.arguments[4].toInt()), b.getF64FloatAttr(0.0));
        };
        if (!auxiliaryResultsRead(op, 1)) {
          define(out, loss(reductions[r]));
          return;
        }
        // nll_loss_backward reads the total weight: without class weights,
        // the count of targets that are not ignored. A mean is then the
        // sum over that count, as ATen computes it, which a split batch
        // keeps split (two Partial sums) where a mean would gather it.
        auto tt = cast<RankedTensorType>(target.getType());
        Type f = lt.getElementType();
        Value ignore = FullOp::create(b, loc, RankedTensorType::get({}, tt.getElementType()),
                                      b.getF64FloatAttr(static_cast<double>(op.arguments[4].toInt())));
        Value kept = CmpOp::create(b, loc, RankedTensorType::get(tt.getShape(), b.getI1Type()),
                                   CmpPredicate::ne, target, ignore);
        Value ones = CastOp::create(b, loc, RankedTensorType::get(tt.getShape(), f), kept);
        SmallVector<int64_t> all;
        for (int64_t d = 0; d < tt.getRank(); ++d)
          all.push_back(d);
        auto scalar = RankedTensorType::get({}, f);
        Value total = SumOp::create(b, loc, scalar, ones, b.getDenseI64ArrayAttr(all), UnitAttr());
        define(op.results[1].toTensor(), total);
        if (reductions[r] == LossReduction::mean)
          define(out, DivOp::create(b, loc, scalar, loss(LossReduction::sum), total));
        else
          define(out, loss(reductions[r]));
        return;
      }
    }
  }
  if (op.name == "aten::native_layer_norm" && !auxiliaryResultsRead(op, 1)) {
    const at::Tensor &x = op.arguments[0].toTensor();
    std::vector<int64_t> normalized = op.arguments[1].toIntVector();
    SmallVector<Value> ops = {read(x)};
    Value w, bias;
    if (op.arguments[2].isTensor() && op.arguments[2].toTensor().defined())
      w = read(op.arguments[2].toTensor());
    if (op.arguments[3].isTensor() && op.arguments[3].toTensor().defined())
      bias = read(op.arguments[3].toTensor());
    define(op.results[0].toTensor(),
           LayerNormOp::create(b, loc, tensorType(b, op.results[0].toTensor()), read(x), w, bias,
                               b.getDenseI64ArrayAttr(normalized),
                               b.getF64FloatAttr(op.arguments[4].toDouble())));
    return;
  }
  // conj of a complex tensor and _neg_view are views that read conjugated
  // or negated (a bit on the tensor): values, materialized.
  if (op.results.size() == 1 && op.results[0].isTensor() && !op.arguments.empty() &&
      op.arguments[0].isTensor() &&
      (op.name == "aten::_neg_view" ||
       ((op.name == "aten::conj" || op.name == "aten::_conj") &&
        op.arguments[0].toTensor().is_complex()))) {
    const at::Tensor &out = op.results[0].toTensor();
    define(out, generic(op.name == "aten::_neg_view" ? "aten::neg" : "aten::conj_physical", op,
                        {tensorType(b, out)}));
    return;
  }
  // Views: results that alias an argument without writing it. (`to` and
  // `contiguous` alias only when nothing changes: values, not views.)
  bool handled = false;
  bool mayAlias = op.name != "aten::to" && op.name != "aten::contiguous";
  for (size_t i = 0; mayAlias && i < fs.returns().size() && i < op.results.size(); ++i) {
    const c10::AliasInfo *info = fs.returns()[i].alias_info();
    if (!info || info->isWrite() || !op.results[i].isTensor())
      continue;
    for (size_t j = 0; j < fs.arguments().size(); ++j) {
      const c10::AliasInfo *ai = fs.arguments()[j].alias_info();
      // A view of another dtype (view_as_real, view_as_complex,
      // view(dtype)) is a value: a generic op copies it (a write through it
      // is not tracked back).
      if (ai && ai->beforeSets() == info->beforeSets() && op.arguments[j].isTensor() &&
          op.arguments[j].toTensor().scalar_type() == op.results[i].toTensor().scalar_type()) {
        const at::Tensor &result = op.results[i].toTensor();
        views[result.unsafeGetTensorImpl()] = View{op.arguments[j].toTensor(), &op, {}, {}, 0};
        cur.erase(result.unsafeGetTensorImpl());
        handled = true;
      }
    }
  }
  if (handled)
    return;
  // In-place (or out=) ops: the written argument gets the op's value.
  int written = -1;
  for (size_t j = 0; j < fs.arguments().size(); ++j) {
    const c10::AliasInfo *ai = fs.arguments()[j].alias_info();
    if (ai && ai->isWrite() && op.arguments[j].isTensor()) {
      written = static_cast<int>(j);
      break;
    }
  }
  if (written >= 0) {
    // An op that writes an argument in place and returns new tensors beside
    // it (_native_batch_norm_legit's running statistics) is not one value.
    for (size_t i = 0; i < fs.returns().size(); ++i)
      if (!fs.returns()[i].alias_info() && i < op.results.size() && op.results[i].isTensor())
        throw ::tdx::capture::CaptureError(
            "tdx: " + fullName(op) + " writes its argument '" + fs.arguments()[written].name() +
            "' in place and returns other tensors, which tdx cannot record as values yet; "
            "use an op that returns what it writes (F.batch_norm for the batch norms; "
            "F.rrelu in eval mode), or run this part outside fake_mode/deferred_init");
    const at::Tensor &target = op.arguments[written].toTensor();
    Value v = functional(op, target);
    if (!v) {
      v = generic(functionalVariant(fs), op, {tensorType(b, target)});
    }
    write(target, v);
    for (const c10::IValue &r : op.results)
      if (r.isTensor() && r.toTensor().defined())
        define(r.toTensor(), cur[target.unsafeGetTensorImpl()]);
    return;
  }
  // Functional ops.
  if (op.results.size() == 1 && op.results[0].isTensor()) {
    const at::Tensor &out = op.results[0].toTensor();
    Value v = functional(op, out);
    if (!v)
      v = generic(fullName(op), op, {tensorType(b, out)});
    define(out, v);
    return;
  }
  // The tensor results in order, a Tensor[] result's elements in its place
  // (as the runtime's callAten returns them).
  std::vector<at::Tensor> tensors;
  forEachTensor(op.results, [&](const at::Tensor &t) { tensors.push_back(t); });
  if (tensors.empty()) {
    // torch._assert_async's check stays in the program, as an op of no
    // result (kept: tdx.aten); other ops without tensor results change
    // nothing we track.
    if (op.name == "aten::_assert_async")
      generic(fullName(op), op, {});
    return;
  }
  SmallVector<Type> types;
  for (const at::Tensor &t : tensors)
    // An undefined result (a gradient output_mask did not ask for) is an
    // empty tensor that nothing reads.
    types.push_back(t.defined() ? Type(tensorType(b, t))
                                : Type(RankedTensorType::get({0}, b.getF32Type())));
  Value first = generic(fullName(op), op, types);
  Operation *g = first ? first.getDefiningOp() : nullptr;
  for (size_t k = 0; g && k < tensors.size(); ++k)
    if (tensors[k].defined())
      define(tensors[k], g->getResult(k));
}

} // namespace tdx::capture::detail
