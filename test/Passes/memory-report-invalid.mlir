// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-recompute --tdx-memory-report=format=none

// A step over its budget is refused, its largest consumers named.
module attributes {tdx.partitioned, tdx.memory_budget = 100 : i64} {
  tdx.parameter @w : tensor<8x4xf32> init {
    %0 = tdx.full 0.0 : tensor<8x4xf32>
    tdx.yield %0 : tensor<8x4xf32>
  }
  // expected-error @+1 {{the step needs 256 bytes (0.0 MiB) per rank at its peak, over its memory budget of 100 bytes (0.0 MiB): parameters 128, optimizer state 0, inputs 0, gradients 128, activations 0. The largest:}}
  func.func @train_step() -> tensor<f32> {
    %w = tdx.param_ref @w : tensor<8x4xf32>
    %u = tdx.exp %w : tensor<8x4xf32>
    tdx.assign @w, %u : tensor<8x4xf32>
    %z = tdx.full 0.0 : tensor<f32>
    return %z : tensor<f32>
  }
}

// -----

// expected-error @+1 {{tdx-memory-report reports a rank's bytes of a partitioned program; run tdx-spmd (tdx-insert-collectives, tdx-partition) first}}
module attributes {tdx.memory_budget = 100 : i64} {
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{'tdx.memory_budget' must be an i64 byte count > 0 on a module, got 0 : i64}}
module attributes {tdx.memory_budget = 0 : i64} {
}

// -----

// Over its budget even with exp(%x) run again after the peak (1024 of
// 1280 bytes): refused, with what tdx-recompute did.
module attributes {tdx.partitioned, tdx.memory_budget = 900 : i64} {
  // expected-error @+1 {{the step needs 1024 bytes (0.0 MiB) per rank at its peak, over its memory budget of 900 bytes (0.0 MiB): parameters 0, optimizer state 0, inputs 256, gradients 0, activations 768. The largest:}}
  func.func @train_step(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.exp %x : tensor<64xf32>
    %b = tdx.exp %a : tensor<64xf32>
    %c = tdx.exp %b : tensor<64xf32>
    %d = tdx.mul %c, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %e = tdx.mul %d, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    return %e : tensor<64xf32>
  }
}
