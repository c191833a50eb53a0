// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-explain=output=%t.html

// expected-error @+1 {{tdx-explain draws a partitioned program (placements, collectives and a rank's memory); run tdx-spmd first, or tdx.explain(prog, path) from Python, which partitions a copy}}
module {
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{tdx-explain: the module has no function with a body to draw}}
module attributes {tdx.partitioned} {
}
