// Several entries, one state (prog.add_entry): the main entry's placement of
// a parameter is the one every entry reads. @train_step places @w (here by
// an annotation where it reads it); @evaluate, which only reads @w, reads it
// where it is, and is partitioned to the local type: its sum stays a
// partial sum, which the runtime adds when it gathers the result.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s
// RUN: tdx-opt %s --tdx-place --tdx-spmd | tdx-translate --tdx-to-cpp | FileCheck %s --check-prefix=CPP

tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.parameter @w : tensor<4x8xf32> init {
  %0 = tdx.full 1.0 : tensor<4x8xf32>
  tdx.yield %0 : tensor<4x8xf32>
}
// CHECK: tdx.parameter @w : tensor<4x8xf32> sharding <@mesh, [Shard(0)]>
// CHECK-LABEL: func.func @train_step
// CHECK: tdx.param_ref @w {{.*}} : tensor<2x8xf32>
// CHECK-LABEL: func.func @evaluate
// CHECK: tdx.param_ref @w {{.*}} : tensor<2x8xf32>
// CHECK: tdx.sum {{.*}} -> tensor<f32>
// CHECK-NEXT: return
func.func @train_step(%x: tensor<3x8xf32>) -> tensor<3x4xf32> {
  %w = tdx.param_ref @w : tensor<4x8xf32>
  %ws = tdx.annotate %w <@mesh, [Shard(0)]> : tensor<4x8xf32>
  %t = tdx.transpose %ws 0, 1 : tensor<4x8xf32> -> tensor<8x4xf32>
  %y = tdx.matmul %x, %t : (tensor<3x8xf32>, tensor<8x4xf32>) -> tensor<3x4xf32>
  %n = tdx.mul %w, %w : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  tdx.assign @w, %n : tensor<4x8xf32>
  return %y : tensor<3x4xf32>
}
func.func @evaluate(%x: tensor<3x8xf32>) -> tensor<f32> {
  %w = tdx.param_ref @w : tensor<4x8xf32>
  %t = tdx.transpose %w 0, 1 : tensor<4x8xf32> -> tensor<8x4xf32>
  %y = tdx.matmul %x, %t : (tensor<3x8xf32>, tensor<8x4xf32>) -> tensor<3x4xf32>
  %s = tdx.sum %y dims = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// Both entries are emitted; the other entry is entries[0] of the program,
// with its own signature.
// CPP-LABEL: static std::vector<T::Tensor> forward(
// CPP-LABEL: static std::vector<T::Tensor> entry1(
// CPP: {"w", 0, 2, T::kFloat, "[Shard(0)]"},
// CPP: static Program describe()
// CPP: p.inputs.push_back({{[{][{]}}3, 8}, T::kFloat, "[Replicate]"});
// CPP: p.entries.push_back({"evaluate", {{[{][{][{]}}3, 8}, T::kFloat, "[Replicate]"}}, {{[{][{][{]}}}, T::kFloat, "[Partial(sum)]"}}, entry1});
