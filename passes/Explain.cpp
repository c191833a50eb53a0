//===- Explain.cpp - the plan as one static HTML page ---------------------===//
//
// One page, inline SVG, no script and nothing fetched: each state tensor's
// placement on every mesh axis (grouped by layer, identical layers drawn
// once), every collective at its place in the step with its bytes, the
// step's live bytes over time, and a rank's memory by kind.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Target/Collectives.h"
#include "tdx/Target/Lifetimes.h"
#include "tdx/Target/StepMemory.h"
#include "tdx/Transforms/Passes.h"
#include "PipelineStages.h"
#include "ReportPass.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/ToolOutputFile.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace mlir::tdx {
#define GEN_PASS_DEF_EXPLAIN
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

// One color per placement kind and per collective, used by the drawing and
// its legend (and by test_explain, which looks for them in a screenshot).
constexpr const char *kShardColor = "#4e79a7", *kReplicateColor = "#bab0ac",
                     *kPartialColor = "#f28e2b";
const std::pair<const char *, const char *> kCollectiveColors[] = {
    {"all_gather", "#59a14f"},     {"all_reduce", "#e15759"}, {"reduce_scatter", "#b07aa1"},
    {"all_to_all", "#9c755f"},     {"broadcast", "#76b7b2"}};
// A pipeline's forward and backward blocks.
constexpr const char *kForwardColor = "#1f77b4", *kBackwardColor = "#9467bd",
                     *kWeightsColor = "#17becf";
const std::pair<const char *, const char *> kMemoryColors[] = {
    {"parameters", "#8cd17d"}, {"optimizer", "#86bcb6"}, {"inputs", "#f1ce63"},
    {"gradients", "#ff9d9a"},  {"activations", "#d4a6c8"}};

std::string escape(StringRef s) {
  std::string out;
  llvm::raw_string_ostream os(out);
  llvm::printHTMLEscaped(s, os);
  return out;
}

std::string placementText(PlacementAttr p) {
  std::string s = layoutToString({p});
  return s.substr(1, s.size() - 2); // drop the brackets
}

const char *placementColor(PlacementAttr p) {
  return p.isShard() ? kShardColor : p.isPartial() ? kPartialColor : kReplicateColor;
}

std::string human(int64_t bytes) {
  char buf[32];
  if (bytes >= (1 << 30))
    snprintf(buf, sizeof(buf), "%.2f GiB", bytes / 1073741824.0);
  else if (bytes >= (1 << 20))
    snprintf(buf, sizeof(buf), "%.2f MiB", bytes / 1048576.0);
  else if (bytes >= (1 << 10))
    snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  else
    snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  return buf;
}

/// A state tensor's row: its name within its layer, its placement, and its
/// optimizer state's (of its own shape; none without one).
struct Row {
  std::string name;
  Layout placement, optimizer;
};

/// `layers.3.attn.wq.weight` is in layer `layers.3` as `attn.wq.weight`:
/// the name up to its first number; a name without one is the model's.
std::pair<std::string, std::string> splitLayer(StringRef name) {
  SmallVector<StringRef> parts;
  name.split(parts, '.');
  for (size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].empty() && llvm::all_of(parts[i], [](char c) { return llvm::isDigit(c); }) && i + 1 < parts.size())
      return {llvm::join(ArrayRef<StringRef>(parts).take_front(i + 1), "."),
              llvm::join(ArrayRef<StringRef>(parts).drop_front(i + 1), ".")};
  return {"", name.str()};
}

struct ExplainPass : public mlir::tdx::impl::ExplainBase<ExplainPass> {
  using ExplainBase::ExplainBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!module->hasAttr(TdxDialect::kPartitionedAttrName)) {
      module.emitError("tdx-explain draws a partitioned program (placements, collectives and "
                       "a rank's memory); run tdx-spmd first, or tdx.explain(prog, path) from "
                       "Python, which partitions a copy");
      return signalPassFailure();
    }
    func::FuncOp fn = stepWithBody(module, getArgument(), "draw");
    if (!fn)
      return signalPassFailure();
    std::unique_ptr<llvm::ToolOutputFile> file = openReport(module, getArgument(), outputFile);
    if (!file)
      return signalPassFailure();
    MeshOp mesh;
    for (auto m : module.getOps<MeshOp>()) {
      mesh = m;
      break;
    }
    std::string html;
    llvm::raw_string_ostream os(html);
    Block &block = fn.getBody().front();
    Lifetimes lifetimes(block);
    StepMemory held = stepMemory(module, fn);
    int64_t working = workingBytes(fn, lifetimes);
    int64_t peak = held.fixed() + working;

    os << "<!doctype html>\n<html><head><meta charset=\"utf-8\">\n<title>tdx plan: @"
       << escape(fn.getSymName()) << "</title>\n<style>\n"
       << "body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}\n"
       << "h2{margin-top:28px;border-bottom:1px solid #ddd}\n"
       << "table{border-collapse:collapse;font-size:13px}\n"
       << "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\n"
       << "th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}\n"
       << "svg text{font-family:sans-serif;font-size:12px}\n.key{display:inline-block;"
       << "width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}\n"
       << "</style></head><body>\n";
    os << "<h1>tdx plan: @" << escape(fn.getSymName()) << "</h1>\n<p>";
    if (mesh) {
      os << "Mesh @" << escape(mesh.getSymName()) << " [";
      for (auto [i, size] : llvm::enumerate(mesh.getShape()))
        os << (i ? ", " : "") << escape(cast<StringAttr>(mesh.getAxes()[i]).getValue()) << " " << size;
      os << "]. ";
    } else {
      os << "One rank. ";
    }
    std::vector<CollectiveUse> uses = collectivesIn(fn);
    os << lifetimes.liveBytes().size() - 1 << " ops per rank, " << uses.size()
       << " collectives, " << human(peak) << " per rank at the peak.</p>\n";

    drawPlacements(os, module, mesh);
    drawPipeline(os, module);
    drawStep(os, block, lifetimes, uses);
    drawMemory(os, module, held, working, peak);
    os << "<p style=\"color:#888;font-size:12px\">Drawn by tdx-explain from the per-rank "
          "program (its most loaded rank where shards are uneven).</p>\n</body></html>\n";
    file->os() << html;
    file->keep();
    markAllAnalysesPreserved();
  }

  /// Per layer and per state tensor, its placement on each mesh axis (and
  /// its optimizer state's, where ZeRO places that otherwise); consecutive
  /// layers placed alike are drawn once.
  void drawPlacements(llvm::raw_ostream &os, ModuleOp module, MeshOp mesh) {
    os << "<h2>Placements</h2>\n";
    int64_t axes = mesh ? static_cast<int64_t>(mesh.getShape().size()) : 0;
    if (!axes) {
      os << "<p>No mesh: every tensor is whole on the one rank.</p>\n";
      return;
    }
    // Every state by name, with its type and placement.
    std::map<std::string, std::pair<Type, Layout>> states;
    SmallVector<std::string> order;
    for (Operation &op : module.getOps()) {
      auto state = dyn_cast<StateOpInterface>(&op);
      if (!state || state.getTiedState())
        continue;
      std::string name = SymbolTable::getSymbolName(&op).str();
      states[name] = {state.getStateType(),
                      state.getStateSharding() ? layoutOf(state.getStateSharding())
                                               : replicatedLayout(module.getContext(), axes)};
      order.push_back(name);
    }
    SmallVector<std::pair<std::string, Row>> rows; // (layer, row)
    for (const std::string &name : order) {
      if (StringRef(name).starts_with("optimizer."))
        continue;
      auto &[type, layout] = states[name];
      auto [layer, rest] = splitLayer(name);
      Row row{rest, layout, {}};
      // Its optimizer state of its own shape (Adam's moments, a momentum
      // buffer), if it has one.
      std::string prefix = "optimizer." + name + ".";
      for (auto it = states.lower_bound(prefix);
           it != states.end() && StringRef(it->first).starts_with(prefix); ++it)
        if (it->second.first == type) {
          row.optimizer = it->second.second;
          break;
        }
      rows.push_back({layer, row});
    }
    // Groups of consecutive rows of one layer; a group drawn like the one
    // before it joins it.
    struct Group {
      std::string first, last;
      int64_t count = 1;
      SmallVector<Row> rows;
      std::string signature;
    };
    SmallVector<Group> groups;
    for (auto &[layer, row] : rows) {
      if (groups.empty() || groups.back().first != layer)
        groups.push_back({layer, layer, 1, {}, ""});
      groups.back().rows.push_back(row);
    }
    for (Group &g : groups)
      for (Row &r : g.rows)
        g.signature += r.name + layoutToString(r.placement) + layoutToString(r.optimizer) + ";";
    SmallVector<Group> merged;
    for (Group &g : groups) {
      if (!merged.empty() && !g.first.empty() && merged.back().signature == g.signature) {
        merged.back().last = g.first;
        ++merged.back().count;
        continue;
      }
      merged.push_back(g);
    }
    // Optimizer state is drawn where ZeRO places some of it otherwise.
    bool zero = llvm::any_of(rows, [](auto &r) {
      return !r.second.optimizer.empty() && r.second.optimizer != r.second.placement;
    });
    const int64_t rowH = 18, nameW = 300, cellW = 96;
    int64_t lines = 0;
    for (Group &g : merged)
      lines += 1 + g.rows.size();
    int64_t width = nameW + cellW * axes * (zero ? 2 : 1) + 10, height = rowH * (lines + 2);
    os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
       << height << "\">\n";
    for (int64_t a = 0; a < axes; ++a) {
      os << "<text x=\"" << nameW + a * cellW + 4 << "\" y=\"" << rowH - 4 << "\">"
         << escape(cast<StringAttr>(mesh.getAxes()[a]).getValue()) << "</text>\n";
      if (zero)
        os << "<text x=\"" << nameW + (axes + a) * cellW + 4 << "\" y=\"" << rowH - 4
           << "\">optimizer " << escape(cast<StringAttr>(mesh.getAxes()[a]).getValue()) << "</text>\n";
    }
    int64_t y = rowH;
    auto cell = [&](int64_t column, PlacementAttr p) {
      os << "<rect x=\"" << nameW + column * cellW << "\" y=\"" << y + 1 << "\" width=\""
         << cellW - 2 << "\" height=\"" << rowH - 2 << "\" fill=\"" << placementColor(p)
         << "\"/><text x=\"" << nameW + column * cellW + 4 << "\" y=\"" << y + rowH - 5
         << "\" fill=\"#fff\">" << escape(placementText(p)) << "</text>\n";
    };
    for (Group &g : merged) {
      std::string title = g.first.empty() ? std::string("(not in a layer)")
                          : g.count == 1  ? g.first
                                          : g.first + " ... " + g.last + " (" +
                                               std::to_string(g.count) + " layers placed alike)";
      os << "<text x=\"2\" y=\"" << y + rowH - 5 << "\" font-weight=\"bold\">" << escape(title)
         << "</text>\n";
      y += rowH;
      for (Row &r : g.rows) {
        os << "<text x=\"14\" y=\"" << y + rowH - 5 << "\">" << escape(r.name) << "</text>\n";
        for (int64_t a = 0; a < axes && a < static_cast<int64_t>(r.placement.size()); ++a)
          cell(a, r.placement[a]);
        for (int64_t a = 0; zero && a < axes && a < static_cast<int64_t>(r.optimizer.size()); ++a)
          cell(axes + a, r.optimizer[a]);
        y += rowH;
      }
    }
    os << "</svg>\n<p><span class=\"key\" style=\"background:" << kShardColor
       << "\"></span>Shard(d): split on dim d<span class=\"key\" style=\"background:"
       << kReplicateColor << "\"></span>Replicate<span class=\"key\" style=\"background:"
       << kPartialColor << "\"></span>Partial: a partial sum on each rank</p>\n";
  }

  /// A pipeline's stages (each chunk's layers and seconds) and its schedule
  /// as tdx-schedule-pipeline timed it: one row per pipeline rank, a block
  /// per forward (F) or backward (B) of a chunk on a micro-batch, the gaps
  /// its bubbles, with each rank's idle over busy time next to (p-1)/(v m).
  void drawPipeline(llvm::raw_ostream &os, ModuleOp module) {
    std::optional<PipelinePlan> plan = scheduledPipeline(module);
    if (!plan)
      return;
    int64_t m = plan->microbatches, v = plan->stagesPerRank, p = plan->ranks;
    os << "<h2>Pipeline: " << p << " ranks on \"" << escape(plan->axis) << "\", "
       << escape(plan->schedule) << ", " << m << " micro-batches"
       << (v > 1 ? ", " + std::to_string(v) + " stages per rank" : "")
       << "</h2>\n<table><tr><th>stage</th><th>rank</th><th>layers</th><th>forward "
          "seconds (cost model)</th></tr>\n";
    for (auto [c, layers] : llvm::enumerate(plan->stages)) {
      std::string names;
      for (const std::string &l : layers)
        names += (names.empty() ? "" : ", ") + (l.empty() ? std::string("(root)") : l);
      os << "<tr><td>" << c << "</td><td>" << c % p << "</td><td>" << escape(names)
         << "</td><td>"
         << llvm::format("%.3g", c < plan->chunkSeconds.size() ? plan->chunkSeconds[c] : 0.0)
         << "</td></tr>\n";
    }
    os << "</table>\n";
    double end = plan->end();
    const int64_t left = 90, plotW = 1000, rowH = 28;
    double scale = end > 0 ? plotW / end : 0;
    os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + plotW + 20
       << "\" height=\"" << rowH * (p + 1) << "\">\n";
    for (int64_t r = 0; r < p; ++r)
      os << "<rect x=\"" << left << "\" y=\"" << r * rowH + 2 << "\" width=\"" << plotW
         << "\" height=\"" << rowH - 4 << "\" fill=\"#eeeeee\"/><text x=\"2\" y=\""
         << r * rowH + rowH - 10 << "\">rank " << r << "</text>\n";
    for (const PipelineTask &t : plan->timeline) {
      double x = left + t.start * scale, w = std::max((t.end - t.start) * scale - 1, 1.0);
      const char *kinds[] = {"F", "B", "W"}, *names[] = {"forward", "backward", "weights"},
                 *colors[] = {kForwardColor, kBackwardColor, kWeightsColor};
      int64_t phase = std::clamp<int64_t>(t.phase, 0, 2);
      std::string label = kinds[phase] + std::to_string(t.microbatch) +
                          (v > 1 ? " s" + std::to_string(t.chunk) : "");
      os << "<rect x=\"" << llvm::format("%.1f", x) << "\" y=\"" << t.rank * rowH + 2
         << "\" width=\"" << llvm::format("%.1f", w) << "\" height=\"" << rowH - 4
         << "\" fill=\"" << colors[phase] << "\"><title>" << names[phase] << " of stage "
         << t.chunk << ", micro-batch " << t.microbatch << "</title></rect>\n";
      if (w > 24)
        os << "<text x=\"" << llvm::format("%.1f", x + 3) << "\" y=\"" << t.rank * rowH + rowH - 10
           << "\" fill=\"#fff\">" << label << "</text>\n";
    }
    os << "<text x=\"" << left << "\" y=\"" << rowH * p + 16 << "\">time (cost model), "
       << "gray: the bubbles</text>\n</svg>\n<p><span class=\"key\" style=\"background:"
       << kForwardColor << "\"></span>forward<span class=\"key\" style=\"background:"
       << kBackwardColor << "\"></span>backward<span class=\"key\" style=\"background:"
       << kWeightsColor << "\"></span>weights' gradients (zero bubble). Bubble (idle over "
          "busy time) by rank:";
    for (auto [r, bubble] : llvm::enumerate(plan->bubbles()))
      os << " " << r << ": " << llvm::format("%.2f", bubble);
    os << "; (p-1)/(v m) = " << llvm::format("%.2f", plan->idealBubble()) << ".</p>\n";
  }

  /// The step from start to end: its live bytes, and each collective where
  /// it runs, tall by its bytes; then the collectives by kind and axes.
  void drawStep(llvm::raw_ostream &os, Block &block, const Lifetimes &lifetimes,
                ArrayRef<CollectiveUse> uses) {
    os << "<h2>The step: memory and collectives over time</h2>\n";
    ArrayRef<int64_t> live = lifetimes.liveBytes();
    int64_t points = std::max<int64_t>(static_cast<int64_t>(live.size()) - 1, 1);
    int64_t most = std::max<int64_t>(1, *std::max_element(live.begin(), live.end()));
    int64_t largest = 1;
    for (const CollectiveUse &u : uses)
      largest = std::max(largest, u.bytes);
    const int64_t left = 90, plotW = 1000, curveH = 160, laneH = 36;
    int64_t lanes = std::size(kCollectiveColors);
    int64_t height = curveH + 30 + lanes * laneH + 30;
    auto xOf = [&](int64_t point) { return left + plotW * point / points; };
    os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + plotW + 20
       << "\" height=\"" << height << "\">\n";
    // The live bytes of the step's own tensors.
    os << "<text x=\"2\" y=\"14\">live bytes</text><text x=\"2\" y=\"30\">" << human(most)
       << "</text>\n<polyline fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" points=\"";
    for (auto [i, bytes] : llvm::enumerate(live))
      os << xOf(static_cast<int64_t>(i)) << "," << 10 + curveH - curveH * bytes / most << " ";
    os << "\"/>\n<line x1=\"" << left << "\" y1=\"" << 10 + curveH << "\" x2=\"" << left + plotW
       << "\" y2=\"" << 10 + curveH << "\" stroke=\"#999\"/>\n";
    if (Operation *peak = lifetimes.peakOp()) {
      int64_t x = xOf(lifetimes.pointOf(peak));
      os << "<line x1=\"" << x << "\" y1=\"10\" x2=\"" << x << "\" y2=\"" << 10 + curveH
         << "\" stroke=\"#e15759\" stroke-dasharray=\"4 3\"/><text x=\"" << x + 4
         << "\" y=\"22\" fill=\"#e15759\">peak " << human(lifetimes.peakBytes()) << "</text>\n";
    }
    // One lane per kind of collective.
    int64_t top = curveH + 30;
    for (auto [lane, kc] : llvm::enumerate(kCollectiveColors)) {
      int64_t y = top + static_cast<int64_t>(lane) * laneH;
      os << "<text x=\"2\" y=\"" << y + laneH - 10 << "\">" << kc.first << "</text>\n<line x1=\""
         << left << "\" y1=\"" << y + laneH - 4 << "\" x2=\"" << left + plotW << "\" y2=\""
         << y + laneH - 4 << "\" stroke=\"#eee\"/>\n";
      for (const CollectiveUse &u : uses) {
        if (u.kind != kc.first)
          continue;
        Operation *at = block.findAncestorOpInBlock(*u.op);
        int64_t point = at ? lifetimes.pointOf(at) : -1;
        if (point < 0)
          continue;
        // Tall by the log of its bytes, so small ones still show.
        double share = u.bytes > 0 ? std::log2(1.0 + u.bytes) / std::log2(1.0 + largest) : 0.1;
        int64_t h = std::max<int64_t>(3, static_cast<int64_t>(share * (laneH - 8)));
        os << "<rect x=\"" << xOf(point) - 1 << "\" y=\"" << y + laneH - 4 - h
           << "\" width=\"3\" height=\"" << h << "\" fill=\"" << kc.second << "\"><title>"
           << u.kind << " over " << escape(llvm::join(u.axes, ", ")) << ": " << human(u.bytes)
           << " " << escape(u.dtype) << " at " << escape(u.location) << "</title></rect>\n";
      }
    }
    os << "<text x=\"" << left << "\" y=\"" << height - 6 << "\">start of the step</text>"
       << "<text x=\"" << left + plotW - 90 << "\" y=\"" << height - 6 << "\">end</text>\n"
       << "</svg>\n";
    // The collectives by kind, axes and element type.
    std::map<std::tuple<std::string, std::string, std::string>, std::pair<int64_t, int64_t>> by;
    for (const CollectiveUse &u : uses) {
      auto &[count, bytes] = by[{u.kind, llvm::join(u.axes, ", "), u.dtype}];
      ++count;
      bytes += std::max<int64_t>(u.bytes, 0);
    }
    os << "<table><tr><th>collective</th><th>mesh axes</th><th>element type</th><th>count</th>"
          "<th>bytes per rank</th></tr>\n";
    for (auto &[key, value] : by)
      os << "<tr><td>" << std::get<0>(key) << "</td><td>" << escape(std::get<1>(key))
         << "</td><td>" << escape(std::get<2>(key)) << "</td><td>" << value.first << "</td><td>"
         << human(value.second) << "</td></tr>\n";
    if (by.empty())
      os << "<tr><td colspan=\"5\">none: no rank talks to another</td></tr>\n";
    os << "</table>\n";
  }

  /// A rank's bytes by kind, against its budget.
  void drawMemory(llvm::raw_ostream &os, ModuleOp module, const StepMemory &held,
                  int64_t working, int64_t peak) {
    os << "<h2>Memory per rank</h2>\n";
    int64_t activations = held.activations(working);
    int64_t values[] = {held.parameters, held.optimizer, held.inputs, held.gradients, activations};
    auto budget = module->getAttrOfType<IntegerAttr>(TdxDialect::kMemoryBudgetAttrName);
    int64_t scale = std::max<int64_t>(1, std::max(peak, budget ? budget.getInt() : 0));
    const int64_t width = 1000, barH = 34;
    os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width + 20 << "\" height=\""
       << barH + 30 << "\">\n";
    int64_t x = 0;
    for (auto [i, kc] : llvm::enumerate(kMemoryColors)) {
      int64_t w = width * values[i] / scale;
      os << "<rect x=\"" << x << "\" y=\"4\" width=\"" << w << "\" height=\"" << barH
         << "\" fill=\"" << kc.second << "\"><title>" << kc.first << ": " << human(values[i])
         << "</title></rect>\n";
      x += w;
    }
    if (budget) {
      int64_t bx = width * budget.getInt() / scale;
      os << "<line x1=\"" << bx << "\" y1=\"0\" x2=\"" << bx << "\" y2=\"" << barH + 8
         << "\" stroke=\"#222\" stroke-width=\"2\"/><text x=\"" << std::max<int64_t>(bx - 120, 0)
         << "\" y=\"" << barH + 24 << "\">budget " << human(budget.getInt()) << "</text>\n";
    }
    os << "</svg>\n<table><tr><th>kind</th><th>bytes</th><th></th></tr>\n";
    for (auto [i, kc] : llvm::enumerate(kMemoryColors))
      os << "<tr><td><span class=\"key\" style=\"background:" << kc.second << "\"></span>"
         << kc.first << "</td><td>" << values[i] << "</td><td>" << human(values[i])
         << "</td></tr>\n";
    os << "<tr><th>peak</th><th>" << peak << "</th><th>" << human(peak) << "</th></tr>\n";
    if (budget)
      os << "<tr><td>budget</td><td>" << budget.getInt() << "</td><td>"
         << (peak > budget.getInt() ? "over it" : "within it") << "</td></tr>\n";
    os << "</table>\n";
  }
};

} // namespace
