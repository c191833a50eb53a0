//===- ModelSummary.cpp - print parameters, buffers and op counts ---------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "ReportPass.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_MODELSUMMARY
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct Row {
  std::string name, kind, dtype, shape, init, sharding;
  int64_t elements = 0, bytes = 0;
  bool tied = false;
};

std::string typeStr(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

std::string humanBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  if (u == 0)
    os << bytes << " B";
  else
    os << llvm::format("%.2f %s", v, units[u]);
  return s;
}

/// How the init region makes its value: the op that produces the yielded
/// value, with how many ops the region has in all.
std::string describeInit(Region &init) {
  auto yield = cast<YieldOp>(init.front().getTerminator());
  Operation *producer = yield.getValues().front().getDefiningOp();
  std::string s = producer ? producer->getName().getStringRef().str() : "?";
  size_t numOps = init.front().getOperations().size() - 1;
  if (numOps > 1)
    s += " (" + std::to_string(numOps) + " ops)";
  return s;
}

template <typename StateOp>
Row makeRow(StateOp op, StringRef kind) {
  Row row;
  RankedTensorType type = op.getTensorType();
  row.name = op.getSymName().str();
  row.kind = kind.str();
  row.dtype = typeStr(type.getElementType());
  std::string shape;
  llvm::raw_string_ostream os(shape);
  llvm::interleave(type.getShape(), os, "x");
  row.shape = shape.empty() ? "scalar" : shape;
  row.elements = type.hasStaticShape() ? type.getNumElements() : 0;
  row.bytes = row.elements * elementBytes(type.getElementType());
  if (auto tied = op.getTiedToAttr()) {
    row.tied = true;
    row.init = "tied to " + tied.getValue().str();
  } else {
    row.init = describeInit(op.getInit());
  }
  if (auto sharding = op.getShardingAttr()) {
    std::string s;
    llvm::raw_string_ostream sos(s);
    sos << Attribute(sharding);
    row.sharding = s;
  } else {
    row.sharding = "-";
  }
  return row;
}

struct ModelSummaryPass
    : public mlir::tdx::impl::ModelSummaryBase<ModelSummaryPass> {
  using ModelSummaryBase::ModelSummaryBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::unique_ptr<llvm::ToolOutputFile> file = openReport(module, getArgument(), outputFile);
    if (!file)
      return signalPassFailure();
    llvm::raw_ostream &os = file->os();

    std::vector<Row> rows;
    module.walk([&](Operation *op) {
      if (auto p = dyn_cast<ParameterOp>(op))
        rows.push_back(makeRow(p, "parameter"));
      else if (auto b = dyn_cast<BufferOp>(op))
        rows.push_back(makeRow(b, "buffer"));
    });

    size_t wName = 4, wShape = 5, wInit = 4;
    for (const Row &r : rows) {
      wName = std::max(wName, r.name.size());
      wShape = std::max(wShape, r.shape.size());
      wInit = std::max(wInit, r.init.size());
    }
    auto pad = [&](StringRef s, size_t w) {
      os << s;
      for (size_t i = s.size(); i < w + 2; ++i)
        os << ' ';
    };
    pad("name", wName);
    pad("kind", 9);
    pad("dtype", 5);
    pad("shape", wShape);
    pad("elements", 10);
    pad("bytes", 10);
    pad("init", wInit);
    os << "sharding\n";
    // Totals as torch counts them: parameters() yields a tied tensor once.
    struct Total {
      int64_t count = 0, tied = 0, elements = 0, bytes = 0;
    } params, buffers;
    for (const Row &r : rows) {
      pad(r.name, wName);
      pad(r.kind, 9);
      pad(r.dtype, 5);
      pad(r.shape, wShape);
      pad(r.tied ? "-" : std::to_string(r.elements), 10);
      pad(r.tied ? "-" : humanBytes(r.bytes), 10);
      pad(r.init, wInit);
      os << r.sharding << "\n";
      Total &total = r.kind == "parameter" ? params : buffers;
      ++total.count;
      if (r.tied) {
        ++total.tied;
        continue;
      }
      total.elements += r.elements;
      total.bytes += r.bytes;
    }
    auto printTotal = [&](StringRef what, const Total &t) {
      os << "total " << what << ": " << t.count << " (" << t.tied << " tied), "
         << t.elements << " elements, " << humanBytes(t.bytes) << "\n";
    };
    printTotal("parameters", params);
    printTotal("buffers", buffers);

    module.walk([&](func::FuncOp fn) {
      llvm::MapVector<StringRef, int64_t> counts;
      int64_t total = 0;
      fn.walk([&](Operation *op) {
        if (op == fn.getOperation())
          return;
        ++counts[op->getName().getStringRef()];
        ++total;
      });
      os << "\nfunc @" << fn.getSymName() << ": " << total << " op(s)\n";
      SmallVector<std::pair<StringRef, int64_t>> sorted(counts.begin(),
                                                        counts.end());
      llvm::stable_sort(sorted, [](auto &a, auto &b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
      });
      for (auto &[name, count] : sorted)
        os << "  " << llvm::left_justify(name, 24) << count << "\n";
    });
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
