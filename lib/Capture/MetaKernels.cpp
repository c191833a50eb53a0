//===- MetaKernels.cpp - shapes of ops this torch has no meta kernel for --===//
//
// Fake tensors run every op's Meta kernel (torch's own, in C++ or from
// torch/_meta_registrations.py) for its result shapes. Torch 2.15 still
// lacks one for a few ops whose result shapes do not depend on data: these
// give their shapes, so the ops record like any other and run through ATen
// in the program. Every entry below was checked against torch 2.15.0 (the
// op has no Meta kernel, or its composite calls one that has none; the
// OpInfo test fails on the op without the entry); delete an entry once torch has one (the
// registration then fails at import with "Mismatch in kernel" or shadows
// torch's). Ops whose shapes do depend on data (nonzero, unique,
// masked_select) are refused at trace instead (FakeTensor.cpp). The OpInfo
// test (test/python/test_opinfo.py) runs each of these against eager.
//
//===----------------------------------------------------------------------===//

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

using at::Tensor;
using TensorPair = std::tuple<Tensor, Tensor>;

Tensor meta(c10::IntArrayRef sizes, const Tensor &like,
            c10::ScalarType dtype = c10::ScalarType::Undefined) {
  auto options = like.options().device(c10::kMeta);
  return at::empty(sizes, dtype == c10::ScalarType::Undefined ? options : options.dtype(dtype));
}

/// A backward op with `N` arguments whose one result is the gradient of
/// argument `K`, so has its shape.
template <int N, int K>
void gradientOf(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  at::Tensor of = torch::jit::peek(*stack, K, N).toTensor();
  torch::jit::drop(*stack, N);
  torch::jit::push(*stack, meta(of.sizes(), of));
}
template <int N, int K> torch::CppFunction gradient() {
  return torch::CppFunction::makeFromBoxedFunction<&gradientOf<N, K>>();
}

} // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  // geqrf(self) -> (a, tau): torch 2.15 has no meta kernel (only
  // linalg_qr's); a is self's shape, tau (batch..., min(m, n)).
  m.impl("geqrf", [](const Tensor &self) -> TensorPair {
    TORCH_CHECK(self.dim() >= 2, "geqrf: the input needs at least 2 dims");
    std::vector<int64_t> tau = self.sizes().slice(0, self.dim() - 2).vec();
    tau.push_back(std::min(self.size(-2), self.size(-1)));
    return {meta(self.sizes(), self), meta(tau, self)};
  });
  // histogram.bin_ct(self, bins, range, weight, density) -> (hist, bin_edges):
  // torch 2.15 registers meta kernels for the histogramdd helpers only.
  m.impl("histogram.bin_ct",
         [](const Tensor &self, int64_t bins, std::optional<c10::ArrayRef<double>>,
            const std::optional<Tensor> &, bool) -> TensorPair {
           return {meta({bins}, self), meta({bins + 1}, self)};
         });
  // linalg_lstsq: torch 2.15's composite kernel calls linalg_lstsq.out,
  // which has no meta kernel. Its auxiliary results depend on the driver
  // (gelsy, the CPU's default, gives the rank only); gelsd and gelss compute
  // residuals only where the rank is full: a shape that depends on values.
  m.impl("linalg_lstsq", [](const Tensor &self, const Tensor &b, std::optional<double>,
                            std::optional<c10::string_view> driverName) {
    TORCH_CHECK(self.dim() >= 2, "linalg.lstsq: the input needs at least 2 dims");
    bool vector = b.dim() == self.dim() - 1;
    int64_t m = self.size(-2), n = self.size(-1), k = vector ? 1 : b.size(-1);
    std::vector<int64_t> batch = at::infer_size(self.sizes().slice(0, self.dim() - 2),
                                                b.sizes().slice(0, b.dim() - (vector ? 1 : 2)));
    std::string driver = driverName ? std::string(*driverName) : "gelsy";
    TORCH_CHECK(driver == "gelsy" || driver == "gels" || m <= n,
                "tdx: linalg.lstsq with driver='", driver, "' returns residuals only where the "
                "rank is full, a shape that depends on values; use driver='gelsy' or 'gels'");
    auto with = [&](std::vector<int64_t> tail) {
      std::vector<int64_t> sizes = batch;
      sizes.insert(sizes.end(), tail.begin(), tail.end());
      return sizes;
    };
    Tensor solution = meta(with(vector ? std::vector<int64_t>{n} : std::vector<int64_t>{n, k}), b);
    Tensor residuals = driver != "gelsy" && m > n
                           ? meta(with(vector ? std::vector<int64_t>{} : std::vector<int64_t>{k}), b)
                           : meta({0}, b);
    Tensor rank = driver == "gels" ? meta({0}, b, at::kLong) : meta(batch, b, at::kLong);
    Tensor singular = driver == "gelsd" || driver == "gelss" ? meta(with({std::min(m, n)}), b)
                                                             : meta({0}, b);
    return std::make_tuple(solution, residuals, rank, singular);
  });
  // Backward ops of losses and pooling with no meta kernel in torch 2.15:
  // their one result is the gradient of their input (argument 1).
  m.impl("fractional_max_pool3d_backward", gradient<5, 1>());
  m.impl("multi_margin_loss_backward", gradient<7, 1>());
  m.impl("multilabel_margin_loss_backward", gradient<5, 1>());
  // _ctc_loss_backward(grad, log_probs, targets, input_lengths,
  // target_lengths, neg_log_likelihood, log_alpha, blank, zero_infinity):
  // the gradient of log_probs (both overloads: lengths as int[] or Tensor).
  m.impl("_ctc_loss_backward", gradient<9, 1>());
  m.impl("_ctc_loss_backward.Tensor", gradient<9, 1>());
}
