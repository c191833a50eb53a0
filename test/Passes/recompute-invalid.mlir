// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-recompute=budget=-1

// expected-error @+1 {{tdx-recompute: budget must be a byte count >= 0 (0: the module's tdx.memory_budget), got -1}}
module {
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
