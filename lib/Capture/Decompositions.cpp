//===- Decompositions.cpp - composites routed for fake tensors ------------===//
//
// CompositeImplicitAutograd ops that tdx routes differently for fake
// tensors, above autograd; real tensors take torch's own kernel. Each entry
// says why torch 2.15's own composite does not serve:
// - cov reads data to check a value (its weights, through aten::equal),
//   which a fake tensor has not;
// - quantile and nanquantile check q in [0, 1] by reading q (a tensor q);
// - cross_entropy with label smoothing and a class weight selects the
//   targets not ignored with masked_select (a data-dependent shape).
//
//===----------------------------------------------------------------------===//

#include "tdx/Capture/Capture.h"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/cross_entropy_loss_native.h>
#include <ATen/ops/cov_native.h>
#include <ATen/ops/nanquantile_native.h>
#include <ATen/ops/quantile_native.h>
#include <torch/library.h>

namespace {

/// cov(x, correction, fweights, aweights) as libtorch computes it. The
/// checks that read data are left out (weights not negative and not summing
/// to zero); a normalization factor <= 0, which eager warns about and sets
/// to 0, is set to 0 by a select.
at::Tensor cov(const at::Tensor &self, int64_t correction,
               const c10::optional<at::Tensor> &fweights,
               const c10::optional<at::Tensor> &aweights) {
  if (!tdx::capture::isFake(self))
    return at::native::cov(self, correction, fweights, aweights);
  TORCH_CHECK(self.dim() <= 2, "cov(): expected input to have two or fewer dimensions but got ",
              self.dim());
  at::Tensor in = self.dim() < 2 ? self.view({1, -1}) : self;
  int64_t observations = in.size(1);
  at::Tensor w;
  if (fweights && fweights->defined())
    w = *fweights;
  bool weighted = aweights && aweights->defined();
  if (weighted)
    w = w.defined() ? w * *aweights : *aweights;
  at::Tensor wSum = w.defined() ? w.sum()
                                : at::scalar_tensor(observations, in.options().dtype(at::kLong));
  at::Tensor avg = (w.defined() ? in * w : in).sum(1) / wSum;
  at::Tensor norm;
  if (!w.defined())
    norm = at::scalar_tensor(observations - correction, in.options().dtype(at::kLong));
  else if (correction == 0)
    norm = wSum;
  else if (!weighted)
    norm = wSum - correction;
  else
    norm = wSum - correction * (w * *aweights).sum() / wSum;
  norm = at::where(norm.le(0), at::zeros_like(norm), norm);
  at::Tensor centered = in - avg.unsqueeze(1);
  at::Tensor c = at::mm(centered, (w.defined() ? centered * w : centered).t().conj());
  return at::true_divide(c, norm).squeeze();
}

/// quantile and nanquantile as libtorch computes them (sort, ranks in q's
/// dtype, gather, lerp), without the check that q is in [0, 1], which reads
/// q: a q the program is given is not checked.
at::Tensor quantileOf(const at::Tensor &self, const at::Tensor &q, c10::optional<int64_t> dim,
                      bool keepdim, c10::string_view interpolation, bool ignoreNan) {
  TORCH_CHECK(self.numel() > 0, "quantile() input tensor must be non-empty");
  TORCH_CHECK(q.dim() <= 1, "quantile() q must be a scalar or 1D tensor");
  TORCH_CHECK(self.scalar_type() == at::kFloat || self.scalar_type() == at::kDouble,
              "quantile() input tensor must be either float or double dtype");
  TORCH_CHECK(self.scalar_type() == q.scalar_type(),
              "quantile() q tensor must be same dtype as the input tensor");
  TORCH_CHECK(interpolation == "linear" || interpolation == "lower" ||
                  interpolation == "higher" || interpolation == "midpoint" ||
                  interpolation == "nearest",
              "quantile() interpolation must be one of linear, lower, higher, midpoint or "
              "nearest. Got ", interpolation);
  int64_t d = c10::maybe_wrap_dim(dim.value_or(0), self.dim());
  // The result's shape without q's dim.
  std::vector<int64_t> out;
  if (dim && self.dim() > 0) {
    out = self.sizes().vec();
    if (keepdim)
      out[d] = 1;
    else
      out.erase(out.begin() + d);
  } else if (keepdim) {
    out.assign(self.dim(), 1);
  }
  // The reduced values last, sorted (NaN sorts last).
  at::Tensor x = !dim ? self.flatten()
                      : d == self.dim() - 1 ? self : self.unsqueeze(-1).transpose(d, -1);
  std::vector<int64_t> shape = out;
  shape.push_back(x.size(-1));
  at::Tensor sorted = std::get<0>(x.reshape(shape).sort());
  at::Tensor ranks;
  if (ignoreNan) {
    ranks = q * (sorted.isnan().logical_not().sum(-1, true) - 1);
    ranks = at::where(ranks < 0, at::zeros_like(ranks), ranks);
  } else {
    int64_t last = sorted.size(-1) - 1;
    std::vector<at::Tensor> both = at::broadcast_tensors({q * last, sorted.isnan().any(-1, true)});
    ranks = at::masked_fill(both[0], both[1], last);
  }
  if (interpolation == "lower")
    ranks = ranks.floor();
  else if (interpolation == "higher")
    ranks = ranks.ceil();
  else if (interpolation == "nearest")
    ranks = ranks.round();
  at::Tensor below = ranks.to(at::kLong);
  at::Tensor values = sorted.gather(-1, below);
  if (interpolation == "linear" || interpolation == "midpoint") {
    at::Tensor weights =
        interpolation == "midpoint" ? at::full_like(ranks, 0.5) : ranks - below;
    at::Tensor above = sorted.gather(-1, ranks.ceil().to(at::kLong));
    values = values.lerp(above, weights);
  }
  return q.dim() == 0 ? values.squeeze(-1) : values.unsqueeze(0).transpose(0, -1).squeeze(-1);
}

/// quantile (IgnoreNan false) and nanquantile with a tensor q.
template <bool IgnoreNan>
at::Tensor quantileTensor(const at::Tensor &self, const at::Tensor &q, c10::optional<int64_t> dim,
                          bool keepdim, c10::string_view interpolation) {
  if (!tdx::capture::isFake(self) && !tdx::capture::isFake(q))
    return IgnoreNan ? at::native::nanquantile(self, q, dim, keepdim, interpolation)
                     : at::native::quantile(self, q, dim, keepdim, interpolation);
  return quantileOf(self, q, dim, keepdim, interpolation, IgnoreNan);
}

/// quantile and nanquantile with a float q, which is checked here.
template <bool IgnoreNan>
at::Tensor quantileScalar(const at::Tensor &self, double q, c10::optional<int64_t> dim,
                          bool keepdim, c10::string_view interpolation) {
  if (!tdx::capture::isFake(self))
    return IgnoreNan ? at::native::nanquantile(self, q, dim, keepdim, interpolation)
                     : at::native::quantile(self, q, dim, keepdim, interpolation);
  TORCH_CHECK(q >= 0 && q <= 1, "quantile() q must be in the range [0, 1] but got ", q);
  return quantileOf(self, at::scalar_tensor(q, self.options()), dim, keepdim, interpolation,
                    IgnoreNan);
}

/// cross_entropy with label smoothing and class-index targets, as torch
/// computes it, but the mean over the targets not ignored is a sum over all
/// of them (ignored ones are zero) divided by their count or weight, where
/// torch (2.15 as 1.13 did) selects them with masked_select (data-dependent
/// shape) when a class weight is given. Other calls go on to torch's own.
at::Tensor crossEntropySmoothed(const at::Tensor &self, const at::Tensor &target,
                                const c10::optional<at::Tensor> &weight, int64_t reduction,
                                int64_t ignoreIndex, double labelSmoothing) {
  bool weighted = weight && weight->defined();
  TORCH_CHECK(labelSmoothing <= 1.0, "label_smoothing must be between 0.0 and 1.0. Got: ",
              labelSmoothing);
  int64_t classDim = self.dim() == 1 ? 0 : 1;
  at::Tensor input = at::log_softmax(self, classDim, self.scalar_type());
  at::Tensor nll = at::nll_loss_nd(input, target, weight, reduction, ignoreIndex);
  int64_t classes = input.size(classDim);
  at::Tensor smooth;
  if (weighted) {
    std::vector<int64_t> shape(input.dim(), 1);
    shape[classDim] = weight->size(0);
    smooth = -(input * weight->view(shape)).sum(classDim);
  } else {
    smooth = -input.sum(classDim);
  }
  at::Tensor ignored = target == ignoreIndex;
  smooth = smooth.masked_fill(ignored, 0.0);
  at::Tensor total;
  if (weighted) {
    at::Tensor index = target.masked_fill(ignored, 0).flatten();
    total = weight->gather(0, index).masked_fill(ignored.flatten(), 0).sum();
  } else {
    total = ignored.logical_not().sum();
  }
  at::Tensor ret = smooth.sum() / total;
  return (1 - labelSmoothing) * nll + ret * (labelSmoothing / classes);
}

at::Tensor crossEntropy(const at::Tensor &self, const at::Tensor &target,
                        const c10::optional<at::Tensor> &weight, int64_t reduction,
                        c10::SymInt ignoreIndex, double labelSmoothing) {
  bool weighted = weight && weight->defined();
  if (!tdx::capture::isFake(self) || !weighted || labelSmoothing <= 0.0 ||
      self.sizes() == target.sizes() || reduction != at::Reduction::Mean)
    return at::native::cross_entropy_loss_symint(self, target, weight, reduction, ignoreIndex,
                                                 labelSmoothing);
  return crossEntropySmoothed(self, target, weight, reduction, ignoreIndex.expect_int(),
                              labelSmoothing);
}

void registerDecompositions(torch::Library &m) {
  m.impl("cov", TORCH_FN(cov));
  m.impl("cross_entropy_loss", TORCH_FN(crossEntropy));
  m.impl("quantile", TORCH_FN(quantileTensor<false>));
  m.impl("quantile.scalar", TORCH_FN(quantileScalar<false>));
  m.impl("nanquantile", TORCH_FN(quantileTensor<true>));
  m.impl("nanquantile.scalar", TORCH_FN(quantileScalar<true>));
}

} // namespace

TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) { registerDecompositions(m); }
TORCH_LIBRARY_IMPL(aten, AutogradMeta, m) { registerDecompositions(m); }
TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) { registerDecompositions(m); }
