// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// Every argument kind of a generic op reaches callAten exactly: None,
// optional tensor lists (operands passed in the list, not positionally),
// bool and float lists, strings with quotes, devices by name; then the
// results' shapes, which the CPU runtime checks ATen's results against
// ({-2}: nothing reads it).
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4x8xf32>, %i: tensor<3xi64>, %w: tensor<2x4x3xf32>) -> tensor<4x3xf32> {
    // CHECK: callAten("aten::index.Tensor", {v0}, {{[{][{]}}"indices", c10::IValue(c10::List<c10::optional<at::Tensor>>({c10::nullopt, v1})){{[}][}]}}, {{[{][{]}}4, 3{{[}][}]}});
    %0 = tdx.aten "aten::index.Tensor"(%x, %i) {args = {indices = [unit, 1 : index]}} : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
    // CHECK: callAten("aten::convolution", {v0, v2}, {{[{][{]}}"bias", c10::IValue()}, {"dilation", c10::IValue(std::vector<int64_t>{1})}, {"groups", c10::IValue(int64_t(1))}, {"transposed", c10::IValue(false)}}, {{[{][{]}}-2{{[}][}]}});
    %1 = tdx.aten "aten::convolution"(%x, %w) {args = {bias = unit, dilation = array<i64: 1>, transposed = false, groups = 1 : i64}} : (tensor<4x8xf32>, tensor<2x4x3xf32>) -> tensor<4x2x6xf32>
    // CHECK: {"mask", c10::IValue(c10::List<bool>({true, false}))}, {"scale_factors", c10::IValue(c10::List<double>({2.00000000000000000e+00}))}
    %2 = tdx.aten "aten::mylib"(%x) {args = {scale_factors = [2.0], mask = [true, false]}} : (tensor<4x8xf32>) -> tensor<8x16xf32>
    // CHECK: {"device", c10::IValue(std::string("cpu"))}, {"reduce", c10::IValue(std::string("a\"b"))}
    %3 = tdx.aten "aten::mylib2"(%x) {args = {reduce = "a\"b", device = "cpu"}} : (tensor<4x8xf32>) -> tensor<8x16xf32>
    return %0 : tensor<4x3xf32>
  }
}
