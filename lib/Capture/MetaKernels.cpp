//===- MetaKernels.cpp - shapes of ops libtorch 1.13 has no meta kernel for -===//
//
// Fake tensors run every op's Meta kernel for its result shapes. libtorch
// 1.13 lacks one for some ops whose result shapes do not depend on data:
// backward ops (a gradient has the shape of the tensor it is the gradient
// of) and linalg_solve_triangular (which lu, qr and cholesky's backwards
// call); these give their shapes, so the ops record like any other. The
// OpInfo test (test/python/test_opinfo.py) shows which ops still lack one.
//
//===----------------------------------------------------------------------===//

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

at::Tensor metaLike(const at::Tensor &t) {
  return at::empty(t.sizes(), t.options().device(c10::kMeta));
}

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
  at::Tensor gradInput = mask.get(0) ? metaLike(input) : at::Tensor();
  at::Tensor gradWeight = mask.get(1) ? metaLike(weight) : at::Tensor();
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
  torch::jit::push(*stack, metaLike(of));
}

/// linalg_solve_triangular(A, B, *, upper, left, unitriangular) -> X: the
/// batch dims of A and B broadcast, then B's matrix dims.
void solveTriangular(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  at::Tensor a = torch::jit::peek(*stack, 0, 5).toTensor();
  at::Tensor b = torch::jit::peek(*stack, 1, 5).toTensor();
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2,
              "linalg.solve_triangular: A and B need at least 2 dims");
  std::vector<int64_t> shape = at::infer_size(a.sizes().slice(0, a.dim() - 2),
                                              b.sizes().slice(0, b.dim() - 2));
  shape.push_back(b.size(-2));
  shape.push_back(b.size(-1));
  torch::jit::drop(*stack, 5);
  torch::jit::push(*stack, at::empty(shape, b.options().device(c10::kMeta)));
}

} // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&convolutionBackward>());
  m.impl("_adaptive_avg_pool2d_backward",
         torch::CppFunction::makeFromBoxedFunction<&gradientOf<2, 1>>());
  m.impl("_adaptive_avg_pool3d_backward",
         torch::CppFunction::makeFromBoxedFunction<&gradientOf<2, 1>>());
  m.impl("smooth_l1_loss_backward", torch::CppFunction::makeFromBoxedFunction<&gradientOf<5, 1>>());
  m.impl("_cdist_backward", torch::CppFunction::makeFromBoxedFunction<&gradientOf<5, 1>>());
  m.impl("fractional_max_pool3d_backward",
         torch::CppFunction::makeFromBoxedFunction<&gradientOf<5, 1>>());
  m.impl("linalg_solve_triangular", torch::CppFunction::makeFromBoxedFunction<&solveTriangular>());
}
