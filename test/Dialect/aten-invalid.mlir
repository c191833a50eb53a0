// RUN: tdx-opt %s -split-input-file -verify-diagnostics

func.func @no_namespace(%x: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.aten' op schema "index_select" is not an operator name; expected 'namespace::name' or 'namespace::name.overload', for example "aten::index_select"}}
  %0 = tdx.aten "index_select"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @bad_overload(%x: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.aten' op schema "aten::add." is not an operator name}}
  %0 = tdx.aten "aten::add."(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @args_not_dict(%x: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.aten' op attribute 'args' failed to satisfy constraint: dictionary of named attribute values}}
  %0 = tdx.aten "aten::relu"(%x) {args = [1, 2]} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @list_names_missing_operand(%x: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.aten' op tensor-list argument 'tensors' names operand #2 but the op has 1 operands}}
  %0 = tdx.aten "aten::cat"(%x) {args = {tensors = [0 : index, 2 : index]}} : (tensor<4xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @list_mixes_kinds(%x: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.aten' op tensor-list argument 'tensors' mixes operand numbers with 1 : i64; its elements are `N : index` or `unit` (None)}}
  %0 = tdx.aten "aten::cat"(%x) {args = {tensors = [0 : index, 1]}} : (tensor<4xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @operand_in_two_lists(%x: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.aten' op operand #0 is in more than one tensor list}}
  %0 = tdx.aten "aten::cat"(%x) {args = {tensors = [0 : index, 0 : index]}} : (tensor<4xf32>) -> tensor<8xf32>
  return
}
