//===- Passes.td - tdx passes ------------------------------*- tablegen -*-===//

#ifndef TDX_PASSES_TD
#define TDX_PASSES_TD

include "mlir/Pass/PassBase.td"

def ModelSummary : Pass<"tdx-model-summary", "::mlir::ModuleOp"> {
  let summary = "Print a table of parameters, buffers and forward ops";
  let description = [{
    Prints, for every `tdx.parameter` and `tdx.buffer`: its qualified name,
    dtype, global shape, element count, bytes, how it is initialized (the op
    that produces the yielded value, or the name it is tied to) and its
    sharding. Then the totals (tied names counted once) and, for each
    function, how many times each op occurs. The IR is left unchanged.

    ```
    tdx-opt model.mlir --tdx-model-summary -o /dev/null
    ```
  }];
  let options = [
    Option<"outputFile", "output", "std::string", /*default=*/"\"-\"",
           "Where to write the summary ('-' is stdout)">
  ];
}

#endif // TDX_PASSES_TD
