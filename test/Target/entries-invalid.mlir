// RUN: tdx-translate --tdx-to-cpp %s -split-input-file -verify-diagnostics

// Several functions and none is @forward or @train_step: which one is the
// main entry is not said.
// expected-error @+1 {{the CPU backend needs one entry function, or @forward or @train_step among several}}
module attributes {tdx.partitioned} {
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// Every entry is emitted: one the CPU backend cannot pass is named.
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
  // expected-error @+1 {{argument #0 has type 'tensor<4xf8E5M2>', which the CPU backend cannot pass; use a ranked tensor of f32/f64/f16/bf16/i64/i32/i1/i16/i8/ui8}}
  func.func @evaluate(%x: tensor<4xf8E5M2>) -> tensor<4xf8E5M2> {
    return %x : tensor<4xf8E5M2>
  }
}
