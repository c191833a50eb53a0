//===- CheckMessages.cpp - every rank's messages and collectives match ----===//
//
// Runs the communication of every rank's program, as the runtime would,
// without data (see Passes.td): a rank of a pipeline runs the function
// `tdx.pipeline` names for its coordinate on the pipeline's axis, every
// other program is run by every rank. A tdx.send never waits (the runtime
// sends in the background), a tdx.recv waits for the oldest send from its
// peer with its tag, a collective waits for every rank of its group (the
// ranks that differ from it only on its mesh axes) to reach a collective
// over the same axes. What cannot finish is an error at the ops involved.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <deque>
#include <map>
#include <tuple>

namespace mlir::tdx {
#define GEN_PASS_DEF_CHECKMESSAGES
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// The ranks of one mesh, row-major, and the groups of its axes.
struct Ranks {
  SmallVector<int64_t> shape;
  SmallVector<StringRef> axes;

  int64_t size() const {
    int64_t n = 1;
    for (int64_t s : shape)
      n *= s;
    return n;
  }
  SmallVector<int64_t> coords(int64_t rank) const {
    SmallVector<int64_t> c(shape.size());
    for (int64_t i = shape.size() - 1; i >= 0; --i) {
      c[i] = rank % shape[i];
      rank /= shape[i];
    }
    return c;
  }
  int64_t rankOf(ArrayRef<int64_t> c) const {
    int64_t r = 0;
    for (size_t i = 0; i < shape.size(); ++i)
      r = r * shape[i] + c[i];
    return r;
  }
  int64_t axis(StringRef name) const {
    auto it = llvm::find(axes, name);
    return it == axes.end() ? -1 : it - axes.begin();
  }
  std::string name(int64_t rank) const {
    std::string s = "rank " + std::to_string(rank);
    if (shape.size() < 2)
      return s;
    SmallVector<int64_t> c = coords(rank);
    s += " (";
    for (size_t i = 0; i < c.size(); ++i)
      s += (i ? ", " : "") + axes[i].str() + "=" + std::to_string(c[i]);
    return s + ")";
  }
  /// The ranks of `rank`'s group over `groupAxes`, in order.
  SmallVector<int64_t> group(int64_t rank, ArrayRef<int64_t> groupAxes) const {
    SmallVector<int64_t> members = {rank};
    for (int64_t a : groupAxes) {
      SmallVector<int64_t> next;
      for (int64_t m : members) {
        SmallVector<int64_t> c = coords(m);
        for (int64_t k = 0; k < shape[a]; ++k) {
          c[a] = k;
          next.push_back(rankOf(c));
        }
      }
      members = std::move(next);
    }
    llvm::sort(members);
    members.erase(std::unique(members.begin(), members.end()), members.end());
    return members;
  }
};

ArrayAttr axesOf(Operation *op) { return op->getAttrOfType<ArrayAttr>("mesh_axes"); }

/// Whether `a` and `b` are the same collective, as the ranks of one group
/// must reach them: the op, its attributes, its operand and result types.
bool sameCollective(Operation *a, Operation *b) {
  return a->getName() == b->getName() && a->getAttrDictionary() == b->getAttrDictionary() &&
         a->getOperandTypes() == b->getOperandTypes() &&
         a->getResultTypes() == b->getResultTypes();
}

/// Whether a received value of type `recv` can hold a sent one of `sent`
/// (a recv's `?` dim takes the message's size).
bool receives(Type recv, Type sent) {
  auto r = dyn_cast<RankedTensorType>(recv);
  auto s = dyn_cast<RankedTensorType>(sent);
  if (!r || !s)
    return recv == sent;
  if (r.getElementType() != s.getElementType() || r.getRank() != s.getRank())
    return false;
  for (auto [x, y] : llvm::zip(r.getShape(), s.getShape()))
    if (!ShapedType::isDynamic(x) && !ShapedType::isDynamic(y) && x != y)
      return false;
  return true;
}

struct CheckMessagesPass : public mlir::tdx::impl::CheckMessagesBase<CheckMessagesPass> {
  Ranks mesh;
  /// Per rank: its program's communication in program order, and how far
  /// it has run.
  std::vector<SmallVector<Operation *>> events;
  std::vector<size_t> pc;
  std::vector<func::FuncOp> programOf;
  /// Sends posted and not yet received, per (source, target, tag).
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::deque<SendOp>> inFlight;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto meshes = module.getOps<MeshOp>();
    if (meshes.empty())
      return;
    MeshOp meshOp = *meshes.begin();
    mesh.shape.assign(meshOp.getShape().begin(), meshOp.getShape().end());
    mesh.axes.clear();
    for (Attribute a : meshOp.getAxes())
      mesh.axes.push_back(cast<StringAttr>(a).getValue());

    // Each program, and the ranks that run it.
    SmallVector<SmallVector<func::FuncOp>> runs;
    auto pipeline = module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName);
    ArrayAttr names = pipeline ? pipeline.getAs<ArrayAttr>("functions") : ArrayAttr();
    if (names) {
      auto axisName = pipeline.getAs<StringAttr>("axis");
      int64_t axis = axisName ? mesh.axis(axisName.getValue()) : -1;
      if (axis < 0 || static_cast<int64_t>(names.size()) != mesh.shape[axis]) {
        module.emitError() << "tdx.pipeline names " << names.size()
                           << " functions for its axis, which the mesh @" << meshOp.getSymName()
                           << " does not have that many ranks on";
        return signalPassFailure();
      }
      SmallVector<func::FuncOp> perRank;
      for (int64_t r = 0; r < mesh.size(); ++r) {
        auto name = cast<FlatSymbolRefAttr>(names[mesh.coords(r)[axis]]);
        auto fn = module.lookupSymbol<func::FuncOp>(name.getAttr());
        if (!fn) {
          module.emitError() << "the pipeline's function " << name << " is missing";
          return signalPassFailure();
        }
        perRank.push_back(fn);
      }
      runs.push_back(perRank);
    } else {
      // One program every rank runs: its collectives are reached in one
      // order by construction, its messages still need their receives.
      for (auto fn : module.getOps<func::FuncOp>()) {
        bool messages = false;
        fn.walk([&](Operation *op) { messages |= isa<SendOp, RecvOp>(op); });
        if (messages)
          runs.push_back(SmallVector<func::FuncOp>(mesh.size(), fn));
      }
    }
    for (ArrayRef<func::FuncOp> perRank : runs)
      if (failed(run(perRank)))
        return signalPassFailure();
  }

  LogicalResult run(ArrayRef<func::FuncOp> perRank) {
    int64_t n = mesh.size();
    events.assign(n, {});
    pc.assign(n, 0);
    programOf.assign(perRank.begin(), perRank.end());
    inFlight.clear();
    DenseMap<Operation *, SmallVector<Operation *>> cache;
    for (int64_t r = 0; r < n; ++r) {
      auto it = cache.find(perRank[r]);
      if (it == cache.end()) {
        SmallVector<Operation *> ops;
        func::FuncOp fn = perRank[r];
        fn.walk([&](Operation *op) {
          if (op->hasTrait<OpTrait::TdxCollective>() && axesOf(op))
            ops.push_back(op);
        });
        for (Operation *op : ops)
          for (Attribute a : axesOf(op))
            if (mesh.axis(cast<StringAttr>(a).getValue()) < 0)
              return op->emitOpError() << "names mesh axis " << a << ", which the mesh does not have";
        it = cache.insert({perRank[r], ops}).first;
      }
      events[r] = it->second;
    }
    while (true) {
      bool progress = false;
      for (int64_t r = 0; r < n; ++r) {
        FailureOr<bool> moved = runMessages(r);
        if (failed(moved))
          return failure();
        progress |= *moved;
      }
      for (int64_t r = 0; r < n; ++r) {
        FailureOr<bool> moved = runCollective(r);
        if (failed(moved))
          return failure();
        progress |= *moved;
      }
      if (!progress)
        break;
    }
    for (int64_t r = 0; r < n; ++r)
      if (pc[r] < events[r].size())
        return deadlock(r);
    for (auto &[key, sends] : inFlight) {
      if (sends.empty())
        continue;
      auto [from, to, tag] = key;
      SendOp send = sends.front();
      InFlightDiagnostic d = send.emitOpError()
                             << "on " << mesh.name(from) << " sends to " << mesh.name(to)
                             << " with tag " << tag << ", which never receives it: a message "
                             << "with no receive (add the tdx.recv, or drop the send)";
      d.attachNote(programOf[to].getBody().back().getTerminator()->getLoc())
          << mesh.name(to) << "'s program ends here";
      return failure();
    }
    return success();
  }

  int64_t peerOf(Operation *op, int64_t rank, int64_t peer) {
    SmallVector<int64_t> c = mesh.coords(rank);
    c[mesh.axis(cast<StringAttr>(axesOf(op)[0]).getValue())] = peer;
    return mesh.rankOf(c);
  }

  /// Runs rank `r`'s sends and receives up to its next collective or a
  /// receive whose message is not sent yet.
  FailureOr<bool> runMessages(int64_t r) {
    bool moved = false;
    while (pc[r] < events[r].size()) {
      Operation *op = events[r][pc[r]];
      if (auto send = dyn_cast<SendOp>(op)) {
        int64_t to = peerOf(op, r, send.getPeer());
        inFlight[{r, to, static_cast<int64_t>(send.getTag())}].push_back(send);
      } else if (auto recv = dyn_cast<RecvOp>(op)) {
        int64_t from = peerOf(op, r, recv.getPeer());
        auto &queue = inFlight[{from, r, static_cast<int64_t>(recv.getTag())}];
        if (queue.empty())
          return moved;
        SendOp send = queue.front();
        queue.pop_front();
        if (!receives(recv.getType(), send.getInput().getType())) {
          InFlightDiagnostic d = recv.emitOpError()
                                 << "on " << mesh.name(r) << " receives " << recv.getType()
                                 << " from " << mesh.name(from) << " (tag " << recv.getTag()
                                 << "), but the tdx.send it receives sends "
                                 << send.getInput().getType()
                                 << "; sender and receiver must agree on shape and dtype";
          d.attachNote(send.getLoc()) << "the send, on " << mesh.name(from);
          return failure();
        }
      } else {
        return moved;
      }
      ++pc[r];
      moved = true;
    }
    return moved;
  }

  SmallVector<int64_t> groupAxes(Operation *op) {
    SmallVector<int64_t> axes;
    for (Attribute a : axesOf(op))
      axes.push_back(mesh.axis(cast<StringAttr>(a).getValue()));
    llvm::sort(axes);
    return axes;
  }

  /// The collective rank `r` is at, or null.
  Operation *collectiveAt(int64_t r) {
    if (pc[r] >= events[r].size())
      return nullptr;
    Operation *op = events[r][pc[r]];
    return isa<SendOp, RecvOp>(op) ? nullptr : op;
  }

  /// Completes the collective rank `r` is at, when every rank of its group
  /// is at one over the same axes.
  FailureOr<bool> runCollective(int64_t r) {
    Operation *op = collectiveAt(r);
    if (!op)
      return false;
    SmallVector<int64_t> axes = groupAxes(op);
    SmallVector<int64_t> members = mesh.group(r, axes);
    for (int64_t m : members) {
      Operation *other = collectiveAt(m);
      if (!other || groupAxes(other) != axes)
        return false;
    }
    for (int64_t m : members) {
      Operation *other = collectiveAt(m);
      if (sameCollective(op, other))
        continue;
      InFlightDiagnostic d = other->emitOpError()
                             << "is where " << mesh.name(m) << " reaches its group's next "
                             << "collective, but " << mesh.name(r) << " of that group reaches "
                             << (op->getName() == other->getName() ? "another '" : "'")
                             << op->getName()
                             << (op->getName() == other->getName() ? "' (other attributes or types)" : "'")
                             << " there: the ranks of a group must reach "
                             << "their collectives in one order (the same op, attributes and "
                             << "types)";
      d.attachNote(op->getLoc()) << mesh.name(r) << "'s collective";
      return failure();
    }
    for (int64_t m : members)
      ++pc[m];
    return true;
  }

  /// What rank `r`, blocked, waits for: the rank whose move it needs.
  int64_t waitsFor(int64_t r) {
    Operation *op = events[r][pc[r]];
    if (auto recv = dyn_cast<RecvOp>(op))
      return peerOf(op, r, recv.getPeer());
    SmallVector<int64_t> axes = groupAxes(op);
    for (int64_t m : mesh.group(r, axes)) {
      Operation *other = collectiveAt(m);
      if (!other || groupAxes(other) != axes)
        return m;
    }
    return r;
  }

  std::string waitText(int64_t r) {
    Operation *op = events[r][pc[r]];
    int64_t p = waitsFor(r);
    std::string s;
    llvm::raw_string_ostream os(s);
    if (auto recv = dyn_cast<RecvOp>(op))
      os << mesh.name(r) << " waits here for the message from " << mesh.name(p) << " with tag "
         << recv.getTag();
    else
      os << mesh.name(r) << " waits here in '" << op->getName() << "' for " << mesh.name(p)
         << " of its group";
    return s;
  }

  /// The first blocked rank's chain of waits: a cycle, or a rank whose
  /// program ended.
  LogicalResult deadlock(int64_t first) {
    SmallVector<int64_t> chain = {first};
    while (true) {
      int64_t next = waitsFor(chain.back());
      if (pc[next] >= events[next].size()) {
        int64_t last = chain.back();
        Operation *op = events[last][pc[last]];
        InFlightDiagnostic d = op->emitOpError()
                               << "never completes: " << waitText(last) << ", whose program "
                               << "ends without " << (isa<RecvOp>(op) ? "sending it" : "reaching it")
                               << " (a deadlock)";
        d.attachNote(programOf[next].getBody().back().getTerminator()->getLoc())
            << mesh.name(next) << "'s program ends here";
        return failure();
      }
      auto seen = llvm::find(chain, next);
      if (seen != chain.end()) {
        SmallVector<int64_t> cycle(seen, chain.end());
        Operation *op = events[cycle[0]][pc[cycle[0]]];
        InFlightDiagnostic d = op->emitOpError() << "deadlocks: " << waitText(cycle[0]);
        for (int64_t m : ArrayRef(cycle).drop_front())
          d.attachNote(events[m][pc[m]]->getLoc()) << waitText(m);
        return failure();
      }
      chain.push_back(next);
    }
  }
};

} // namespace
