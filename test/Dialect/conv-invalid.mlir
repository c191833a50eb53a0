// RUN: tdx-opt %s -split-input-file -verify-diagnostics

func.func @channels(%x: tensor<2x4x9x9xf32>, %w: tensor<6x3x3x3xf32>) {
  // expected-error @+2 {{'tdx.conv' op 4 input channels, weight 'tensor<6x3x3x3xf32>' and groups = 1 do not fit: C and O must be divisible by groups and the weight's dim 1 be C / groups}}
  // expected-error @+1 {{'tdx.conv' op failed to infer returned types}}
  %0 = tdx.conv %x, %w stride = [1, 1] padding = [0, 0] dilation = [1, 1] groups = 1 : (tensor<2x4x9x9xf32>, tensor<6x3x3x3xf32>) -> tensor<2x6x7x7xf32>
  return
}

// -----

func.func @stride_entries(%x: tensor<2x4x9x9xf32>, %w: tensor<6x4x3x3xf32>) {
  // expected-error @+2 {{'tdx.conv' op stride [1] needs 2 entries, one per spatial dim}}
  // expected-error @+1 {{'tdx.conv' op failed to infer returned types}}
  %0 = tdx.conv %x, %w stride = [1] padding = [0, 0] dilation = [1, 1] groups = 1 : (tensor<2x4x9x9xf32>, tensor<6x4x3x3xf32>) -> tensor<2x6x7x7xf32>
  return
}

// -----

func.func @zero_stride(%x: tensor<2x4x9x9xf32>, %w: tensor<6x4x3x3xf32>) {
  // expected-error @+2 {{'tdx.conv' op stride [0, 1] must be positive}}
  // expected-error @+1 {{'tdx.conv' op failed to infer returned types}}
  %0 = tdx.conv %x, %w stride = [0, 1] padding = [0, 0] dilation = [1, 1] groups = 1 : (tensor<2x4x9x9xf32>, tensor<6x4x3x3xf32>) -> tensor<2x6x7x7xf32>
  return
}

// -----

func.func @wrong_result(%x: tensor<2x4x9x9xf32>, %w: tensor<6x4x3x3xf32>) {
  // expected-error @+2 {{'tdx.conv' op inferred type(s) 'tensor<2x6x7x7xf32>' are incompatible with return type(s) of operation 'tensor<2x6x9x9xf32>'}}
  // expected-error @+1 {{'tdx.conv' op failed to infer returned types}}
  %0 = tdx.conv %x, %w stride = [1, 1] padding = [0, 0] dilation = [1, 1] groups = 1 : (tensor<2x4x9x9xf32>, tensor<6x4x3x3xf32>) -> tensor<2x6x9x9xf32>
  return
}

// -----

func.func @kernel_too_large(%x: tensor<2x4x2x2xf32>, %w: tensor<6x4x3x3xf32>) {
  // expected-error @+2 {{'tdx.conv' op kernel 'tensor<6x4x3x3xf32>' is larger than the padded input 'tensor<2x4x2x2xf32>'}}
  // expected-error @+1 {{'tdx.conv' op failed to infer returned types}}
  %0 = tdx.conv %x, %w stride = [1, 1] padding = [0, 0] dilation = [1, 1] groups = 1 : (tensor<2x4x2x2xf32>, tensor<6x4x3x3xf32>) -> tensor<2x6x1x1xf32>
  return
}

// -----

func.func @pool_rank(%x: tensor<4x9x9xf32>) {
  // expected-error @+2 {{'tdx.max_pool' op input must be [N, C, H, W], got 'tensor<4x9x9xf32>'}}
  // expected-error @+1 {{'tdx.max_pool' op failed to infer returned types}}
  %0 = tdx.max_pool %x kernel = [2, 2] stride = [2, 2] padding = [0, 0] dilation = [1, 1] : tensor<4x9x9xf32> -> tensor<4x4x4xf32>
  return
}

// -----

func.func @pool_padding(%x: tensor<2x4x9x9xf32>) {
  // expected-error @+2 {{'tdx.avg_pool' op padding [2, 2] must be at most half of the kernel [2, 2]}}
  // expected-error @+1 {{'tdx.avg_pool' op failed to infer returned types}}
  %0 = tdx.avg_pool %x kernel = [2, 2] stride = [2, 2] padding = [2, 2] dilation = [1, 1] : tensor<2x4x9x9xf32> -> tensor<2x4x6x6xf32>
  return
}

// -----

func.func @avg_dilation(%x: tensor<2x4x9x9xf32>) {
  // expected-error @+2 {{'tdx.avg_pool' op average pooling has no dilation; use [1, 1]}}
  // expected-error @+1 {{'tdx.avg_pool' op failed to infer returned types}}
  %0 = tdx.avg_pool %x kernel = [2, 2] stride = [2, 2] padding = [0, 0] dilation = [2, 2] : tensor<2x4x9x9xf32> -> tensor<2x4x4x4xf32>
  return
}

// -----

func.func @max_count_pad(%x: tensor<2x4x9x9xf32>) {
  // expected-error @+2 {{'tdx.max_pool' op count_include_pad is for average pooling}}
  // expected-error @+1 {{'tdx.max_pool' op failed to infer returned types}}
  %0 = tdx.max_pool %x kernel = [2, 2] stride = [2, 2] padding = [0, 0] dilation = [1, 1] count_include_pad : tensor<2x4x9x9xf32> -> tensor<2x4x4x4xf32>
  return
}
