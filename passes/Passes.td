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

def PrintShardingRules : Pass<"tdx-print-sharding-rules"> {
  let summary = "Report the sharding rule (factor mapping) of every op";
  let description = [{
    Emits a remark at every op in the IR with its factor mapping as
    `tdx-propagate-sharding` sees it, Shardy-style:

    ```
    remark: sharding rule: ([i, k], [k, j]) -> ([i, j]) {i=8, j=4, k=16} reduction={k} partial=sum
    ```

    A dim is written as its factors, major to minor (`jk` for a dim that a
    reshape splits into `j` and `k`), or `1` when it has none. Ops without a
    rule of their own (generic `tdx.aten` ops, other dialects' ops) report
    the fully replicated rule they are treated with. The IR is unchanged.
  }];
}

#endif // TDX_PASSES_TD
