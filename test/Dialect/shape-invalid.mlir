// RUN: tdx-opt %s -split-input-file -verify-diagnostics

func.func @reshape_count(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.reshape' op changes the element count from 16 to 15; a reshape must keep every element}}
  // expected-error @+1 {{'tdx.reshape' op failed to infer returned types}}
  %0 = tdx.reshape %x [3, 5] : tensor<2x8xf32> -> tensor<3x5xf32>
  return
}

// -----

func.func @reshape_two_inferred(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.reshape' op shape has more than one -1; only one dim can be inferred}}
  // expected-error @+1 {{'tdx.reshape' op failed to infer returned types}}
  %0 = tdx.reshape %x [-1, -1] : tensor<2x8xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @reshape_not_multiple(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.reshape' op cannot infer the -1 in the shape: 16 elements are not a multiple of 3}}
  // expected-error @+1 {{'tdx.reshape' op failed to infer returned types}}
  %0 = tdx.reshape %x [-1, 3] : tensor<2x8xf32> -> tensor<5x3xf32>
  return
}

// -----

func.func @reshape_negative(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.reshape' op shape has invalid size -2; sizes are >= 0, or -1 to infer one}}
  // expected-error @+1 {{'tdx.reshape' op failed to infer returned types}}
  %0 = tdx.reshape %x [-2, 8] : tensor<2x8xf32> -> tensor<2x8xf32>
  return
}

// -----

func.func @reshape_result(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.reshape' op inferred type(s) 'tensor<4x4xf32>' are incompatible with return type(s) of operation 'tensor<8x2xf32>'}}
  // expected-error @+1 {{'tdx.reshape' op failed to infer returned types}}
  %0 = tdx.reshape %x [-1, 4] : tensor<2x8xf32> -> tensor<8x2xf32>
  return
}

// -----

func.func @transpose_dim(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.transpose' op dim1 2 is out of range for a tensor of rank 2; valid dims are -2 to 1}}
  // expected-error @+1 {{'tdx.transpose' op failed to infer returned types}}
  %0 = tdx.transpose %x 0, 2 : tensor<2x8xf32> -> tensor<8x2xf32>
  return
}

// -----

func.func @permute_repeat(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.permute' op permutation names dim 0 twice; it must be a permutation of 0..1}}
  // expected-error @+1 {{'tdx.permute' op failed to infer returned types}}
  %0 = tdx.permute %x [0, 0] : tensor<2x8xf32> -> tensor<2x2xf32>
  return
}

// -----

func.func @permute_length(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.permute' op permutation has 3 entries for a tensor of rank 2}}
  // expected-error @+1 {{'tdx.permute' op failed to infer returned types}}
  %0 = tdx.permute %x [0, 1, 2] : tensor<2x8xf32> -> tensor<2x8xf32>
  return
}

// -----

func.func @slice_step(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.slice' op step 0 must be positive}}
  // expected-error @+1 {{'tdx.slice' op failed to infer returned types}}
  %0 = tdx.slice %x dim 1 [0 : 8 : 0] : tensor<2x8xf32> -> tensor<2x8xf32>
  return
}

// -----

func.func @slice_dim(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.slice' op dim 5 is out of range for a tensor of rank 2}}
  // expected-error @+1 {{'tdx.slice' op failed to infer returned types}}
  %0 = tdx.slice %x dim 5 [0 : 8 : 1] : tensor<2x8xf32> -> tensor<2x8xf32>
  return
}

// -----

func.func @slice_result(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.slice' op inferred type(s) 'tensor<2x3xf32>' are incompatible with return type(s) of operation 'tensor<2x4xf32>'}}
  // expected-error @+1 {{'tdx.slice' op failed to infer returned types}}
  %0 = tdx.slice %x dim 1 [0 : 8 : 3] : tensor<2x8xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @concat_shapes(%a: tensor<2x4xf32>, %b: tensor<2x5xf32>) {
  // expected-error @+2 {{'tdx.concat' op input #1 has size 5 in dim 1 but input #0 has 4; only dim 0 may differ}}
  // expected-error @+1 {{'tdx.concat' op failed to infer returned types}}
  %0 = tdx.concat %a, %b dim 0 : (tensor<2x4xf32>, tensor<2x5xf32>) -> tensor<4x4xf32>
  return
}

// -----

func.func @concat_dtype(%a: tensor<2x4xf32>, %b: tensor<2x4xi64>) {
  // expected-error @+2 {{'tdx.concat' op input #1 'tensor<2x4xi64>' must have the rank and element type of input #0 'tensor<2x4xf32>'}}
  // expected-error @+1 {{'tdx.concat' op failed to infer returned types}}
  %0 = tdx.concat %a, %b dim 0 : (tensor<2x4xf32>, tensor<2x4xi64>) -> tensor<4x4xf32>
  return
}

// -----

func.func @concat_empty() {
  // expected-error @+2 {{'tdx.concat' op needs at least one input}}
  // expected-error @+1 {{'tdx.concat' op failed to infer returned types}}
  %0 = tdx.concat dim 0 : () -> tensor<4xf32>
  return
}

// -----

func.func @expand_non_one(%x: tensor<3x2xf32>) {
  // expected-error @+2 {{'tdx.expand' op cannot expand dim 1 of size 2 to 8; only dims of size 1 grow (use -1 to keep a dim)}}
  // expected-error @+1 {{'tdx.expand' op failed to infer returned types}}
  %0 = tdx.expand %x [3, 8] : tensor<3x2xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @expand_fewer(%x: tensor<3x2xf32>) {
  // expected-error @+2 {{'tdx.expand' op gives 1 sizes for a tensor of rank 2; expand can only add dims}}
  // expected-error @+1 {{'tdx.expand' op failed to infer returned types}}
  %0 = tdx.expand %x [6] : tensor<3x2xf32> -> tensor<6xf32>
  return
}

// -----

func.func @expand_new_dim(%x: tensor<3x1xf32>) {
  // expected-error @+2 {{'tdx.expand' op new leading dim 0 needs an explicit size, got -1}}
  // expected-error @+1 {{'tdx.expand' op failed to infer returned types}}
  %0 = tdx.expand %x [-1, 3, 1] : tensor<3x1xf32> -> tensor<1x3x1xf32>
  return
}

// -----

func.func @reshape_overflow(%x: tensor<16xf32>) {
  // expected-error @+2 {{'tdx.reshape' op shape has more elements than an int64 counts}}
  // expected-error @+1 {{'tdx.reshape' op failed to infer returned types}}
  %0 = tdx.reshape %x [1152921504606846977, 16] : tensor<16xf32> -> tensor<1152921504606846977x16xf32>
  return
}
