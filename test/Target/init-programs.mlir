// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// Init programs of several ops are written out whole for the runtime to
// evaluate on each rank's box; one that is not pointwise in the global index
// makes a binary that asks for --params for that parameter, saying why.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["x"]
  tdx.buffer @table : tensor<4x2xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.arange start 0.000000e+00 end 4.000000e+00 step 1.000000e+00 : tensor<4xi64>
    %1 = tdx.cast %0 : tensor<4xi64> to tensor<4xf32>
    %2 = tdx.reshape %1 [4, 1] : tensor<4xf32> -> tensor<4x1xf32>
    %c = arith.constant dense<[5.000000e-01, 2.500000e-01]> : tensor<2xf32>
    %3 = tdx.mul %2, %c : (tensor<4x1xf32>, tensor<2xf32>) -> tensor<4x2xf32>
    %4 = tdx.cos %3 : tensor<4x2xf32>
    tdx.yield %4 : tensor<4x2xf32>
  }
  tdx.parameter @w : tensor<2x4xf32> init {
    %0 = tdx.uniform(-1.0, 1.0) seed(7, 3) : tensor<4x2xf32>
    %1 = tdx.transpose %0 0, 1 : tensor<4x2xf32> -> tensor<2x4xf32>
    tdx.yield %1 : tensor<2x4xf32>
  }
  func.func @forward(%x: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %t = tdx.param_ref @table : tensor<2x2xf32>
    return %x : tensor<2x2xf32>
  }
}

// CHECK:      static const int64_t [[S4:kInitArray[0-9]+]][] = {4};
// CHECK:      static const double [[C:kInitArray[0-9]+]][] = {5.0{{0*}}e-01, 2.5{{0*}}e-01};
// CHECK:      static const tdx::rt::InitNodeData kInitNodes[] = {
// CHECK-NEXT:   {tdx::rt::InitProgram::Arange, tdx::rt::DType::I64, [[S4]], 1, -1, -1,
// CHECK-NEXT:   {tdx::rt::InitProgram::Cast, tdx::rt::DType::F32, [[S4]], 1, 0, -1,
// CHECK-NEXT:   {tdx::rt::InitProgram::Reshape, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 2, 1, -1,
// CHECK-NEXT:   {tdx::rt::InitProgram::Constant, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 1, -1, -1, {{.*}}, [[C]], 2, -1},
// CHECK-NEXT:   {tdx::rt::InitProgram::Mul, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 2, 2, 3,
// CHECK-NEXT:   {tdx::rt::InitProgram::Cos, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 2, 4, -1,
// CHECK-NEXT: };
// CHECK-NEXT: static const int kInitRanges[][2] = {{[{][{]}}0, 6}};
// The entries init() loops over: constant data, no code per state.
// CHECK:      static const EmittedInit kInitEntries[] = {
// CHECK-NEXT:   {"table", 0, "[Shard(0)]"},
// CHECK-NEXT: };
// CHECK-LABEL: static void init(Context &ctx, State &s) {
// CHECK-NEXT: if (!s.count("w"))
// CHECK-NEXT: throw std::runtime_error("tdx: the init program of 'w': 'tdx.transpose' op is not pointwise in the global index, so it cannot be initialized shard by shard yet; pass the weights with --params {{.*}}");
// CHECK-NEXT: for (const EmittedInit &e : kInitEntries)
// CHECK-NEXT: if (!s.count(e.name))
// CHECK-NEXT: s[e.name] = ctx.init(kInit(e.program), parseLayout(e.layout));
// The signature names what must be given: state init() cannot make.
// CHECK: p.needsParams.push_back("w");
// CHECK-NOT: p.needsParams.push_back("table");
