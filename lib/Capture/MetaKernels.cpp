//===- MetaKernels.cpp - shapes of ops libtorch 1.13 has no meta kernel for -===//
//
// Fake tensors run every op's Meta kernel for its result shapes. libtorch
// 1.13 lacks one for some ops whose result shapes do not depend on data:
// these give their shapes, so the ops record like any other and run through
// ATen in the program. Ops whose shapes do depend on data (nonzero, unique,
// masked_select) are refused at trace instead (FakeTensor.cpp). The OpInfo
// test (test/python/test_opinfo.py) runs each of these against eager, and
// shows which ops still lack one.
//
//===----------------------------------------------------------------------===//

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Pool.h>
#include <torch/library.h>

namespace {

using at::Tensor;
using c10::IntArrayRef;
using TensorPair = std::tuple<Tensor, Tensor>;

Tensor meta(IntArrayRef sizes, const Tensor &like, c10::ScalarType dtype) {
  return at::empty(sizes, like.options().device(c10::kMeta).dtype(dtype));
}
Tensor meta(IntArrayRef sizes, const Tensor &like) {
  return meta(sizes, like, like.scalar_type());
}

/// A result shaped like one of its arguments.
Tensor like(const Tensor &t) { return meta(t.sizes(), t); }

/// convolution_backward(grad_output, input, weight, bias_sizes, stride,
/// padding, dilation, transposed, output_padding, groups, output_mask) ->
/// (grad_input, grad_weight, grad_bias), each only where output_mask asks.
void convolutionBackward(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  auto args = torch::jit::last(*stack, 11);
  at::Tensor input = args[1].toTensor(), weight = args[2].toTensor();
  c10::List<bool> mask = args[10].toBoolList();
  at::Tensor gradBias;
  if (mask.get(2)) {
    if (!args[3].isNone()) {
      std::vector<int64_t> sizes;
      for (const c10::IValue &s : args[3].toListRef())
        sizes.push_back(s.isInt() ? s.toInt() : s.toSymInt().expect_int());
      gradBias = at::empty(sizes, weight.options().device(c10::kMeta));
    } else {
      gradBias = at::empty({weight.size(0)}, weight.options().device(c10::kMeta));
    }
  }
  at::Tensor gradInput = mask.get(0) ? like(input) : at::Tensor();
  at::Tensor gradWeight = mask.get(1) ? like(weight) : at::Tensor();
  torch::jit::drop(*stack, 11);
  torch::jit::push(*stack, gradInput, gradWeight, gradBias);
}

/// A backward op with `N` arguments whose one result is the gradient of
/// argument `K`, so has its shape: _adaptive_avg_pool{2,3}d_backward(grad,
/// self), smooth_l1_loss_backward(grad, self, target, reduction, beta),
/// _cdist_backward(grad, x1, x2, p, cdist),
/// fractional_max_pool3d_backward(grad, self, kernel, output_size, indices).
template <int N, int K>
void gradientOf(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  at::Tensor of = torch::jit::peek(*stack, K, N).toTensor();
  torch::jit::drop(*stack, N);
  torch::jit::push(*stack, like(of));
}
template <int N, int K> torch::CppFunction gradient() {
  return torch::CppFunction::makeFromBoxedFunction<&gradientOf<N, K>>();
}

/// `t`'s sizes with `dim` removed, or kept as 1 under keepdim (a 0-D `t`
/// stays 0-D).
std::vector<int64_t> reducedSizes(const Tensor &t, int64_t dim, bool keepdim) {
  std::vector<int64_t> sizes = t.sizes().vec();
  if (sizes.empty())
    return sizes;
  dim = c10::maybe_wrap_dim(dim, t.dim());
  if (keepdim)
    sizes[dim] = 1;
  else
    sizes.erase(sizes.begin() + dim);
  return sizes;
}

/// (values, indices) of a reduction along `dim`: kthvalue, mode, median.dim.
TensorPair valuesAndIndices(const Tensor &self, int64_t dim, bool keepdim) {
  std::vector<int64_t> sizes = reducedSizes(self, dim, keepdim);
  return {meta(sizes, self), meta(sizes, self, at::kLong)};
}

/// `b`'s matrix dims after the broadcast batch dims of `a` and `b`
/// (cholesky_solve, linalg_solve_triangular).
Tensor solveShape(const Tensor &a, const Tensor &b, const char *op) {
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2, op, ": both matrices need at least 2 dims");
  std::vector<int64_t> shape =
      at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2));
  shape.push_back(b.size(-2));
  shape.push_back(b.size(-1));
  return meta(shape, b);
}

/// `self`'s leading dims, then `last` in place of its last `n` dims
/// (max_unpool2d/3d).
Tensor replaceLast(const Tensor &self, int64_t n, IntArrayRef last) {
  TORCH_CHECK(self.dim() > n, "max_unpool: the input needs more than ", n, " dims");
  std::vector<int64_t> sizes = self.sizes().slice(0, self.dim() - n).vec();
  sizes.insert(sizes.end(), last.begin(), last.end());
  return meta(sizes, self);
}

/// max_pool3d_with_indices: ATen's pooling_output_shape per spatial dim.
TensorPair maxPool3d(const Tensor &self, IntArrayRef kernel, IntArrayRef stride,
                     IntArrayRef padding, IntArrayRef dilation, bool ceilMode) {
  TORCH_CHECK(self.dim() == 4 || self.dim() == 5, "max_pool3d: the input needs 4 or 5 dims");
  auto at3 = [](IntArrayRef v, int64_t i, int64_t dflt) {
    return v.empty() ? dflt : v[v.size() == 1 ? 0 : i];
  };
  std::vector<int64_t> sizes = self.sizes().slice(0, self.dim() - 3).vec();
  for (int64_t i = 0; i < 3; ++i) {
    int64_t k = at3(kernel, i, 1);
    sizes.push_back(at::native::pooling_output_shape<int64_t>(
        self.size(self.dim() - 3 + i), k, at3(padding, i, 0), at3(stride, i, k),
        at3(dilation, i, 1), ceilMode));
  }
  return {meta(sizes, self), meta(sizes, self, at::kLong)};
}

/// segment_reduce: `data` with `axis` holding one entry per segment.
Tensor segmentReduce(const Tensor &data, c10::string_view,
                     const c10::optional<Tensor> &lengths, const c10::optional<Tensor> &,
                     const c10::optional<Tensor> &offsets, int64_t axis, bool,
                     const c10::optional<at::Scalar> &) {
  axis = c10::maybe_wrap_dim(axis, data.dim());
  std::vector<int64_t> sizes = data.sizes().vec();
  if (offsets && offsets->defined())
    sizes[axis] = offsets->size(axis) - 1;
  else if (lengths && lengths->defined())
    sizes[axis] = lengths->size(axis);
  else
    TORCH_CHECK(false, "segment_reduce: give lengths or offsets");
  return meta(sizes, data);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  // Linear algebra.
  m.impl("linalg_solve_triangular", [](const Tensor &a, const Tensor &b, bool, bool, bool) {
    return solveShape(a, b, "linalg.solve_triangular");
  });
  m.impl("cholesky", [](const Tensor &self, bool) { return like(self); });
  m.impl("cholesky_inverse", [](const Tensor &self, bool) { return like(self); });
  m.impl("cholesky_solve", [](const Tensor &self, const Tensor &l, bool) {
    return solveShape(l, self, "cholesky_solve");
  });
  m.impl("linalg_matrix_exp", [](const Tensor &self) { return like(self); });
  m.impl("linalg_householder_product", [](const Tensor &input, const Tensor &) {
    return like(input);
  });
  m.impl("ormqr", [](const Tensor &, const Tensor &, const Tensor &c, bool, bool) {
    return like(c);
  });
  m.impl("geqrf", [](const Tensor &self) -> TensorPair {
    TORCH_CHECK(self.dim() >= 2, "geqrf: the input needs at least 2 dims");
    std::vector<int64_t> tau = self.sizes().slice(0, self.dim() - 2).vec();
    tau.push_back(std::min(self.size(-2), self.size(-1)));
    return {like(self), meta(tau, self)};
  });
  m.impl("symeig", [](const Tensor &self, bool eigenvectors, bool) -> TensorPair {
    TORCH_CHECK(self.dim() >= 2, "symeig: the input needs at least 2 dims");
    return {meta(self.sizes().slice(0, self.dim() - 1), self),
            eigenvectors ? like(self) : meta({0}, self)};
  });
  m.impl("linalg_eig", [](const Tensor &self) -> TensorPair {
    TORCH_CHECK(self.dim() >= 2, "linalg.eig: the input needs at least 2 dims");
    c10::ScalarType complex = c10::toComplexType(self.scalar_type());
    return {meta(self.sizes().slice(0, self.dim() - 1), self, complex),
            meta(self.sizes(), self, complex)};
  });
  // linalg_lstsq's auxiliary results depend on the driver (gelsy, the CPU's
  // default, gives the rank only); gelsd and gelss compute residuals only
  // where the rank is full: a shape that depends on values.
  m.impl("linalg_lstsq", [](const Tensor &self, const Tensor &b, c10::optional<double>,
                            c10::optional<c10::string_view> driverName) {
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
  m.impl("polar", [](const Tensor &abs, const Tensor &angle) {
    return meta(at::infer_size(abs.sizes(), angle.sizes()), abs,
                c10::toComplexType(abs.scalar_type()));
  });
  // Scans, sorts and selections along a dim.
  m.impl("cummax", [](const Tensor &self, int64_t) -> TensorPair {
    return {like(self), meta(self.sizes(), self, at::kLong)};
  });
  m.impl("cummin", [](const Tensor &self, int64_t) -> TensorPair {
    return {like(self), meta(self.sizes(), self, at::kLong)};
  });
  m.impl("logcumsumexp", [](const Tensor &self, int64_t) { return like(self); });
  m.impl("kthvalue", [](const Tensor &self, int64_t, int64_t dim, bool keepdim) {
    return valuesAndIndices(self, dim, keepdim);
  });
  m.impl("mode", [](const Tensor &self, int64_t dim, bool keepdim) {
    return valuesAndIndices(self, dim, keepdim);
  });
  m.impl("median", [](const Tensor &self) { return meta({}, self); });
  m.impl("count_nonzero", [](const Tensor &self, c10::optional<int64_t> dim) {
    return meta(dim ? reducedSizes(self, *dim, false) : std::vector<int64_t>{}, self, at::kLong);
  });
  m.impl("take", [](const Tensor &self, const Tensor &index) {
    return meta(index.sizes(), self);
  });
  m.impl("put", [](const Tensor &self, const Tensor &, const Tensor &, bool) {
    return like(self);
  });
  m.impl("frexp.Tensor", [](const Tensor &self) -> TensorPair {
    return {like(self), meta(self.sizes(), self, at::kInt)};
  });
  m.impl("bucketize.Tensor", [](const Tensor &self, const Tensor &, bool outInt32, bool) {
    return meta(self.sizes(), self, outInt32 ? at::kInt : at::kLong);
  });
  m.impl("searchsorted.Tensor",
         [](const Tensor &, const Tensor &self, bool outInt32, bool,
            c10::optional<c10::string_view>, const c10::optional<Tensor> &) {
           return meta(self.sizes(), self, outInt32 ? at::kInt : at::kLong);
         });
  m.impl("segment_reduce", &segmentReduce);
  m.impl("_segment_reduce_backward",
         [](const Tensor &, const Tensor &, const Tensor &data, c10::string_view,
            const c10::optional<Tensor> &, const c10::optional<Tensor> &, int64_t,
            const c10::optional<at::Scalar> &) { return like(data); });
  // Histograms and sampling: shapes from their bin and sample counts.
  m.impl("histc", [](const Tensor &self, int64_t bins, const at::Scalar &, const at::Scalar &) {
    return meta({bins}, self);
  });
  m.impl("histogram.bin_ct",
         [](const Tensor &self, int64_t bins, c10::optional<c10::ArrayRef<double>>,
            const c10::optional<Tensor> &, bool) -> TensorPair {
           return {meta({bins}, self), meta({bins + 1}, self)};
         });
  m.impl("_histogramdd_bin_edges",
         [](const Tensor &self, IntArrayRef bins, c10::optional<c10::ArrayRef<double>>,
            const c10::optional<Tensor> &, bool) {
           std::vector<Tensor> edges;
           for (int64_t b : bins)
             edges.push_back(meta({b + 1}, self));
           return edges;
         });
  m.impl("_histogramdd_from_bin_cts",
         [](const Tensor &self, IntArrayRef bins, c10::optional<c10::ArrayRef<double>>,
            const c10::optional<Tensor> &, bool) { return meta(bins, self); });
  m.impl("_histogramdd_from_bin_tensors",
         [](const Tensor &self, at::TensorList bins, const c10::optional<Tensor> &, bool) {
           std::vector<int64_t> sizes;
           for (const Tensor &b : bins)
             sizes.push_back(b.numel() - 1);
           return meta(sizes, self);
         });
  m.impl("multinomial", [](const Tensor &self, int64_t n, bool, c10::optional<at::Generator>) {
    std::vector<int64_t> sizes = self.sizes().vec();
    TORCH_CHECK(!sizes.empty(), "multinomial: the probabilities need 1 or 2 dims");
    sizes.back() = n;
    return meta(sizes, self, at::kLong);
  });
  m.impl("rrelu_with_noise", [](const Tensor &self, const Tensor &, const at::Scalar &,
                                const at::Scalar &, bool, c10::optional<at::Generator>) {
    return like(self);
  });
  // Losses, pools and distances.
  m.impl("multi_margin_loss", [](const Tensor &self, const Tensor &target, const at::Scalar &,
                                 const at::Scalar &, const c10::optional<Tensor> &,
                                 int64_t reduction) {
    int64_t frames = self.dim() <= 1 ? 1 : self.size(0);
    return reduction == at::Reduction::None && target.dim() > 0 ? meta({frames}, self)
                                                               : meta({}, self);
  });
  m.impl("multilabel_margin_loss_forward",
         [](const Tensor &self, const Tensor &target, int64_t reduction) -> TensorPair {
           int64_t frames = self.dim() <= 1 ? 1 : self.size(0);
           Tensor out = reduction != at::Reduction::None || target.dim() <= 1
                            ? meta({}, self)
                            : meta({frames}, self);
           return {out, meta(target.sizes(), self)};
         });
  m.impl("max_pool3d_with_indices", &maxPool3d);
  m.impl("max_unpool2d", [](const Tensor &self, const Tensor &, IntArrayRef size) {
    return replaceLast(self, 2, size);
  });
  m.impl("max_unpool3d", [](const Tensor &self, const Tensor &, IntArrayRef size, IntArrayRef,
                            IntArrayRef) { return replaceLast(self, 3, size); });
  m.impl("_pdist_forward", [](const Tensor &self, double) {
    TORCH_CHECK(self.dim() == 2, "pdist: the input needs 2 dims");
    int64_t n = self.size(0);
    return meta({n * (n - 1) / 2}, self);
  });
  // Backward ops: each gradient has the shape of what it is the gradient of.
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&convolutionBackward>());
  m.impl("_adaptive_avg_pool2d_backward", gradient<2, 1>());
  m.impl("_adaptive_avg_pool3d_backward", gradient<2, 1>());
  m.impl("smooth_l1_loss_backward", gradient<5, 1>());
  m.impl("_cdist_backward", gradient<5, 1>());
  m.impl("fractional_max_pool3d_backward", gradient<5, 1>());
  m.impl("max_pool3d_with_indices_backward", gradient<8, 1>());
  m.impl("multi_margin_loss_backward", gradient<7, 1>());
  m.impl("multilabel_margin_loss_backward", gradient<5, 1>());
  m.impl("_pdist_backward", gradient<4, 1>());
  // torch registers its Python decomposition, which takes no grad_input,
  // as huber_loss_backward.out's meta kernel; the functional op calls that.
  m.impl("huber_loss_backward", gradient<5, 1>());
  m.impl("rrelu_with_noise_backward", gradient<7, 1>());
  m.impl("unfold_backward", [](const Tensor &grad, IntArrayRef inputSizes, int64_t, int64_t,
                               int64_t) { return meta(inputSizes, grad); });
  m.impl("grid_sampler_2d_backward",
         [](const Tensor &, const Tensor &input, const Tensor &grid, int64_t, int64_t, bool,
            std::array<bool, 2> mask) -> TensorPair {
           // The CPU kernel computes grad_grid whatever the mask says.
           (void)mask[1];
           return {mask[0] ? like(input) : Tensor(), like(grid)};
         });
  m.impl("_embedding_bag_dense_backward",
         [](const Tensor &grad, const Tensor &, const Tensor &, const Tensor &, const Tensor &,
            int64_t numWeights, bool, int64_t, const c10::optional<Tensor> &, int64_t) {
           return meta({numWeights, grad.size(1)}, grad);
         });
  m.impl("_efficientzerotensor",
         [](IntArrayRef size, c10::optional<at::ScalarType> dtype, c10::optional<at::Layout>,
            c10::optional<at::Device>, c10::optional<bool>) {
           return at::empty(size, at::TensorOptions()
                                      .device(c10::kMeta)
                                      .dtype(dtype.value_or(c10::get_default_dtype_as_scalartype())));
         });
}
