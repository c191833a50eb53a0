// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// The names a runner's state_dict() needs besides the state: a tied name
// and the name it shares, and a buffer registered persistent=False. Both
// reach describe(), and --signature prints them (runtime.md).
// CHECK: static Program describe() {
// CHECK: p.tied.push_back({"lm_head.weight", "wte.weight"});
// CHECK: p.nonPersistent.push_back("rope");
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  tdx.parameter @wte.weight : tensor<8x4xf32> init {
    %0 = tdx.full 1.0 : tensor<8x4xf32>
    tdx.yield %0 : tensor<8x4xf32>
  }
  tdx.parameter @lm_head.weight : tensor<8x4xf32> tied_to @wte.weight
  tdx.buffer @rope : tensor<4xf32> non_persistent init {
    %0 = tdx.full 2.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  func.func @forward(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %r = tdx.param_ref @rope : tensor<4xf32>
    %y = tdx.mul %x, %r : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}
