// RUN: tdx-opt %s -split-input-file -verify-diagnostics

func.func @no_broadcast(%a: tensor<4x3xf32>, %b: tensor<4xf32>) {
  // expected-error @+2 {{'tdx.add' op operand shapes [4x3] and [4] do not broadcast: trailing dims must be equal or 1}}
  // expected-error @+1 {{'tdx.add' op failed to infer returned types}}
  %0 = tdx.add %a, %b : (tensor<4x3xf32>, tensor<4xf32>) -> tensor<4x3xf32>
  return
}

// -----

func.func @dtype_mismatch(%a: tensor<4xf32>, %b: tensor<4xf16>) {
  // expected-error @+2 {{'tdx.mul' op operand #1 has element type 'f16' but an earlier operand has 'f32'; insert a 'tdx.cast' so both have one dtype}}
  // expected-error @+1 {{'tdx.mul' op failed to infer returned types}}
  %0 = tdx.mul %a, %b : (tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32>
  return
}

// -----

func.func @wrong_result(%a: tensor<4x1xf32>, %b: tensor<8xf32>) {
  // expected-error @+2 {{'tdx.sub' op inferred type(s) 'tensor<4x8xf32>' are incompatible with return type(s) of operation 'tensor<4x1xf32>'}}
  // expected-error @+1 {{'tdx.sub' op failed to infer returned types}}
  %0 = tdx.sub %a, %b : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x1xf32>
  return
}

// -----

func.func @div_rank_broadcast(%a: tensor<2x3xf32>, %b: tensor<5x2x3xf32>) {
  // expected-error @+2 {{'tdx.div' op inferred type(s) 'tensor<5x2x3xf32>' are incompatible with return type(s) of operation 'tensor<2x3xf32>'}}
  // expected-error @+1 {{'tdx.div' op failed to infer returned types}}
  %0 = tdx.div %a, %b : (tensor<2x3xf32>, tensor<5x2x3xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @pow_unranked(%a: tensor<*xf32>) {
  // expected-error @+1 {{'tdx.pow' op operand #0 must be ranked tensor of any type values, but got 'tensor<*xf32>'}}
  %0 = "tdx.pow"(%a, %a) : (tensor<*xf32>, tensor<*xf32>) -> tensor<*xf32>
  return
}

// -----

func.func @maximum_mismatch(%a: tensor<2xi32>, %b: tensor<2xi64>) {
  // expected-error @+2 {{'tdx.maximum' op operand #1 has element type 'i64'}}
  // expected-error @+1 {{'tdx.maximum' op failed to infer returned types}}
  %0 = tdx.maximum %a, %b : (tensor<2xi32>, tensor<2xi64>) -> tensor<2xi32>
  return
}

// -----

func.func @minimum_shapes(%a: tensor<2xf32>, %b: tensor<3xf32>) {
  // expected-error @+2 {{'tdx.minimum' op operand shapes [2] and [3] do not broadcast}}
  // expected-error @+1 {{'tdx.minimum' op failed to infer returned types}}
  %0 = tdx.minimum %a, %b : (tensor<2xf32>, tensor<3xf32>) -> tensor<3xf32>
  return
}

// -----

func.func @cmp_result(%a: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.cmp' op result #0 must be ranked tensor of 1-bit signless integer values, but got 'tensor<4xi64>'}}
  %0 = tdx.cmp lt, %a, %a : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
  return
}

// -----

func.func @cmp_predicate(%a: tensor<4xi64>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'predicate' [eq, ne, lt, le, gt, ge]}}
  %0 = tdx.cmp less, %a, %a : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi1>
  return
}

// -----

func.func @where_condition(%c: tensor<4xf32>, %a: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.where' op operand #0 must be ranked tensor of 1-bit signless integer values, but got 'tensor<4xf32>'}}
  %0 = tdx.where %c, %a, %a : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @where_branches(%c: tensor<4xi1>, %a: tensor<4xf32>, %b: tensor<4xi64>) {
  // expected-error @+2 {{'tdx.where' op operand #2 has element type 'i64' but an earlier operand has 'f32'}}
  // expected-error @+1 {{'tdx.where' op failed to infer returned types}}
  %0 = tdx.where %c, %a, %b : (tensor<4xi1>, tensor<4xf32>, tensor<4xi64>) -> tensor<4xf32>
  return
}

// -----

func.func @exp_int(%a: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.exp' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi64>'}}
  %0 = tdx.exp %a : tensor<4xi64>
  return
}

// -----

func.func @unary_result(%a: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.tanh' op requires the same type for all operands and results}}
  %0 = "tdx.tanh"(%a) : (tensor<4xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @neg_bool(%a: tensor<4xi1>) {
  // expected-error @+1 {{'tdx.neg' op operand #0 must be ranked tensor of floating-point or 8/16/32/64-bit signless integer values, but got 'tensor<4xi1>'}}
  %0 = tdx.neg %a : tensor<4xi1>
  return
}

// -----

func.func @gelu_approx(%a: tensor<4xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'approximate' [none, tanh]}}
  %0 = tdx.gelu %a approximate = erf : tensor<4xf32>
  return
}

// -----

func.func @cast_shape(%a: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.cast' op changes the shape from 'tensor<4xf32>' to 'tensor<2x2xbf16>'; a cast only changes the element type (use 'tdx.reshape' for the shape)}}
  %0 = tdx.cast %a : tensor<4xf32> to tensor<2x2xbf16>
  return
}

// -----

func.func @log_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.log' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.log %a : tensor<4xi32>
  return
}

// -----

func.func @sqrt_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.sqrt' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.sqrt %a : tensor<4xi32>
  return
}

// -----

func.func @rsqrt_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.rsqrt' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.rsqrt %a : tensor<4xi32>
  return
}

// -----

func.func @sigmoid_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.sigmoid' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.sigmoid %a : tensor<4xi32>
  return
}

// -----

func.func @silu_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.silu' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.silu %a : tensor<4xi32>
  return
}

// -----

func.func @sin_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.sin' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.sin %a : tensor<4xi32>
  return
}

// -----

func.func @cos_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.cos' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi32>'}}
  %0 = tdx.cos %a : tensor<4xi32>
  return
}

// -----

func.func @abs_bool(%a: tensor<4xi1>) {
  // expected-error @+1 {{'tdx.abs' op operand #0 must be ranked tensor of floating-point or 8/16/32/64-bit signless integer values, but got 'tensor<4xi1>'}}
  %0 = tdx.abs %a : tensor<4xi1>
  return
}

// -----

func.func @relu_bool(%a: tensor<4xi1>) {
  // expected-error @+1 {{'tdx.relu' op operand #0 must be ranked tensor of floating-point or 8/16/32/64-bit signless integer values, but got 'tensor<4xi1>'}}
  %0 = tdx.relu %a : tensor<4xi1>
  return
}
