// RUN: tdx-opt %s -split-input-file -verify-diagnostics

// What the backend passes write (tdx.fused, tdx.start / tdx.wait,
// tdx.arena, tdx.part, tdx.step_bytes) is checked wherever it appears.

func.func @not_elementwise(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %k = tdx.fused(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @+1 {{'tdx.matmul' op cannot run in a fused kernel}}
    %m = tdx.matmul %a, %a : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    tdx.yield %m : tensor<4x4xf32>
  }
  return %k : tensor<4x4xf32>
}

// -----

func.func @row_not_last(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %k = tdx.fused(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @+1 {{'tdx.softmax' op cannot run in a fused kernel}}
    %s = tdx.softmax %a dim = 1 : tensor<4x4xf32>
    %e = tdx.exp %s : tensor<4x4xf32>
    tdx.yield %e : tensor<4x4xf32>
  }
  return %k : tensor<4x4xf32>
}

// -----

func.func @other_shape(%x: tensor<4x4xf32>, %y: tensor<4xf32>) -> tensor<4x4xf32> {
  %k = tdx.fused(%x, %y) : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>, %b: tensor<4xf32>):
    // expected-error @+1 {{'tdx.exp' op has result type 'tensor<4xf32>' but the kernel iterates over 'tensor<4x4xf32>'}}
    %e = tdx.exp %b : tensor<4xf32>
    %s = tdx.add %a, %e : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
    tdx.yield %s : tensor<4x4xf32>
  }
  return %k : tensor<4x4xf32>
}

// -----

func.func @argument_types(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'tdx.fused' op body argument #0 is 'tensor<4x4xf64>' but input #0 is 'tensor<4x4xf32>'}}
  %k = tdx.fused(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf64>):
    %c = tdx.cast %a : tensor<4x4xf64> to tensor<4x4xf32>
    tdx.yield %c : tensor<4x4xf32>
  }
  return %k : tensor<4x4xf32>
}

// -----

func.func @too_many_operands(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.fused' op has 17 inputs and results; a kernel launch takes at most 16}}
  %k = tdx.fused(%x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x) : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<4xf32>, %d: tensor<4xf32>, %e: tensor<4xf32>, %f: tensor<4xf32>, %g: tensor<4xf32>, %h: tensor<4xf32>, %i: tensor<4xf32>, %j: tensor<4xf32>, %k1: tensor<4xf32>, %l: tensor<4xf32>, %m: tensor<4xf32>, %n: tensor<4xf32>, %o: tensor<4xf32>, %p: tensor<4xf32>):
    tdx.yield %a : tensor<4xf32>
  }
  return %k : tensor<4xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @start_not_async(%x: tensor<8x4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'tdx.start' op body must be one asynchronous collective (all_gather, all_reduce, reduce_scatter) and the tdx.yield of its result}}
  %t = tdx.start {
    %a = tdx.all_to_all %x on @mesh axes = ["dp"] split = 0 concat = 1 : tensor<8x4xf32> -> tensor<4x8xf32>
    tdx.yield %a : tensor<4x8xf32>
  }
  %r = tdx.wait %t : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @waited_twice(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'tdx.start' op token is waited for 2 times; each started collective is waited for exactly once}}
  %t = tdx.start {
    %r = tdx.all_reduce %x on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    tdx.yield %r : tensor<8xf32>
  }
  %a = tdx.wait %t : tensor<8xf32>
  %b = tdx.wait %t : tensor<8xf32>
  return %a : tensor<8xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @wait_type(%x: tensor<8xf32>) -> tensor<4xf32> {
  %t = tdx.start {
    %r = tdx.reduce_scatter %x on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<8xf32> -> tensor<4xf32>
    tdx.yield %r : tensor<4xf32>
  }
  // expected-error @+1 {{'tdx.wait' op result type 'tensor<8xf32>' is not the started collective's 'tensor<4xf32>'}}
  %a = tdx.wait %t : tensor<8xf32>
  return %x : tensor<8xf32>
}

// -----

func.func @arena_count(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.arena' must be an array<i64> of one arena offset per result (1), got array<i64: 0, 64>}}
  %e = tdx.exp %x {tdx.arena = array<i64: 0, 64>} : tensor<4xf32>
  return %e : tensor<4xf32>
}

// -----

func.func @arena_line(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.arena' must be offsets that are multiples of 64 bytes, or -1, got array<i64: 32>}}
  %e = tdx.exp %x {tdx.arena = array<i64: 32>} : tensor<4xf32>
  return %e : tensor<4xf32>
}

// -----

func.func @parts_in_order(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = tdx.exp %x {tdx.part = 1 : i64} : tensor<4xf32>
  // expected-error @+1 {{is in part 0 after an op of part 1; parts run in order, so they never decrease}}
  %n = tdx.neg %e {tdx.part = 0 : i64} : tensor<4xf32>
  return %n : tensor<4xf32>
}

// -----

// expected-error @+1 {{'tdx.step_bytes' must be an i64 >= 0 on a function, got -1 : i64}}
func.func @step_bytes(%x: tensor<4xf32>) -> tensor<4xf32> attributes {tdx.step_bytes = -1 : i64} {
  return %x : tensor<4xf32>
}
