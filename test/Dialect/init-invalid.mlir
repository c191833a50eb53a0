// RUN: tdx-opt %s -split-input-file -verify-diagnostics

func.func @full_fraction_in_int() {
  // expected-error @+1 {{'tdx.full' op fills an integer tensor with 0.5; the value must be integral}}
  %0 = tdx.full 0.5 : tensor<4xi64>
  return
}

// -----

func.func @full_bool() {
  // expected-error @+1 {{'tdx.full' op fills a boolean tensor with 2; the value must be 0 or 1}}
  %0 = tdx.full 2.0 : tensor<4xi1>
  return
}

// -----

func.func @full_memref() {
  // expected-error @+1 {{invalid kind of type specified: expected builtin.tensor, but found 'memref<4xf32>'}}
  %0 = tdx.full 0.0 : memref<4xf32>
  return
}

// -----

func.func @empty_unranked() {
  // expected-error @+1 {{invalid kind of type specified: expected builtin.tensor, but found 'tensor<*xf32>'}}
  %0 = tdx.empty : tensor<*xf32>
  return
}

// -----

func.func @arange_count() {
  // expected-error @+1 {{'tdx.arange' op produces 8 elements (ceil((end - start) / step)) but the result type 'tensor<7xi64>' has 7}}
  %0 = tdx.arange start 0.0 end 8.0 step 1.0 : tensor<7xi64>
  return
}

// -----

func.func @arange_zero_step() {
  // expected-error @+1 {{'tdx.arange' op step must be finite and non-zero}}
  %0 = tdx.arange start 0.0 end 8.0 step 0.0 : tensor<8xi64>
  return
}

// -----

func.func @arange_wrong_way() {
  // expected-error @+1 {{'tdx.arange' op range [8, 0) with step 1 runs the wrong way}}
  %0 = tdx.arange start 8.0 end 0.0 step 1.0 : tensor<8xi64>
  return
}

// -----

func.func @arange_2d() {
  // expected-error @+1 {{'tdx.arange' op result must be 1-D, got 'tensor<2x4xi64>'}}
  %0 = tdx.arange start 0.0 end 8.0 step 1.0 : tensor<2x4xi64>
  return
}

// -----

func.func @uniform_bounds() {
  // expected-error @+1 {{'tdx.uniform' op needs finite low <= high, got [1, -1)}}
  %0 = tdx.uniform(1.0, -1.0) seed(0, 0) : tensor<4xf32>
  return
}

// -----

func.func @bernoulli_p() {
  // expected-error @+1 {{'tdx.bernoulli' op needs a probability p in [0, 1], got 1.5}}
  %0 = tdx.bernoulli(1.5) seed(0, 0) : tensor<4xf32>
  return
}

// -----

func.func @bernoulli_global_rank() {
  // expected-error @+1 {{'tdx.bernoulli' op global_shape has 1 dims but the result has rank 2}}
  %0 = tdx.bernoulli(0.5) seed(0, 0) {global_shape = array<i64: 8>} : tensor<4x2xf32>
  return
}

// -----

func.func @uniform_global_smaller() {
  // expected-error @+1 {{'tdx.uniform' op result dim 0 of size 8 is not a part of global size 4}}
  %0 = tdx.uniform(0.0, 1.0) seed(0, 0) {global_shape = array<i64: 4>} : tensor<8xf32>
  return
}

// -----

func.func @uniform_int() {
  // expected-error @+1 {{'tdx.uniform' op result #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.uniform(0.0, 1.0) seed(0, 0) : tensor<4xi32>
  return
}

// -----

func.func @normal_negative_std() {
  // expected-error @+1 {{'tdx.normal' op needs a finite mean and a finite std >= 0, got std -1}}
  %0 = tdx.normal(0.0, -1.0) seed(0, 0) : tensor<4xf32>
  return
}

// -----

func.func @trunc_normal_bounds() {
  // expected-error @+1 {{'tdx.trunc_normal' op needs truncation bounds a < b, got [2, -2]}}
  %0 = tdx.trunc_normal(0.0, 1.0, 2.0, -2.0) seed(0, 0) : tensor<4xf32>
  return
}

// -----

func.func @trunc_normal_std() {
  // expected-error @+1 {{'tdx.trunc_normal' op needs a finite std >= 0, got -1}}
  %0 = tdx.trunc_normal(0.0, -1.0, -2.0, 2.0) seed(0, 0) : tensor<4xf32>
  return
}

// -----

func.func @random_without_stream() {
  // expected-error @+1 {{expected ','}}
  %0 = tdx.normal(0.0, 1.0) seed(0) : tensor<4xf32>
  return
}

// -----

func.func @arange_huge() {
  // expected-error @+1 {{'tdx.arange' op range [0, 1e+30) with step 1 has too many elements to index}}
  %0 = tdx.arange start 0.0 end 1.0e30 step 1.0 : tensor<?xi64>
  return
}
