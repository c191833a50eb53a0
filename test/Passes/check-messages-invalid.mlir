// RUN: tdx-opt %s --split-input-file --verify-diagnostics --tdx-check-messages

// Both ranks receive before they send: each waits for the other.
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.recv' op deadlocks: rank 0 waits here for the message from rank 1 with tag 1}}
    %g = tdx.recv on @mesh axes = ["pp"] from 1 tag 1 : tensor<4xf32>
    tdx.send %x on @mesh axes = ["pp"] to 1 tag 0 : tensor<4xf32>
    return %g : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-note @+1 {{rank 1 waits here for the message from rank 0 with tag 0}}
    %a = tdx.recv on @mesh axes = ["pp"] from 0 tag 0 : tensor<4xf32>
    tdx.send %a on @mesh axes = ["pp"] to 0 tag 1 : tensor<4xf32>
    return %a : tensor<4xf32>
  }
}

// -----

// The receiver expects another shape than the sender sends.
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-note @+1 {{the send, on rank 0}}
    tdx.send %x on @mesh axes = ["pp"] to 1 tag 0 : tensor<4xf32>
    return %x : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.recv' op on rank 1 receives 'tensor<8xf32>' from rank 0 (tag 0), but the tdx.send it receives sends 'tensor<4xf32>'; sender and receiver must agree on shape and dtype}}
    %a = tdx.recv on @mesh axes = ["pp"] from 0 tag 0 : tensor<8xf32>
    return %x : tensor<4xf32>
  }
}

// -----

// A send nobody receives.
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.send' op on rank 0 sends to rank 1 with tag 3, which never receives it}}
    tdx.send %x on @mesh axes = ["pp"] to 1 tag 3 : tensor<4xf32>
    return %x : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-note @+1 {{rank 1's program ends here}}
    return %x : tensor<4xf32>
  }
}

// -----

// A receive nobody sends: its peer's program ends first.
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-note @+1 {{rank 0's program ends here}}
    return %x : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.recv' op never completes: rank 1 waits here for the message from rank 0 with tag 2, whose program ends without sending it (a deadlock)}}
    %a = tdx.recv on @mesh axes = ["pp"] from 0 tag 2 : tensor<4xf32>
    return %a : tensor<4xf32>
  }
}

// -----

// The ranks of the pp group reach its two collectives in different orders.
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-note @+1 {{rank 0's collective}}
    %s = tdx.all_reduce %x on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32>
    %g = tdx.all_gather %s on @mesh axes = ["pp"] dim = 0 : tensor<4xf32> -> tensor<8xf32>
    return %s : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.all_gather' op is where rank 1 reaches its group's next collective, but rank 0 of that group reaches 'tdx.all_reduce' there}}
    %g = tdx.all_gather %x on @mesh axes = ["pp"] dim = 0 : tensor<4xf32> -> tensor<8xf32>
    %s = tdx.all_reduce %x on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32>
    return %s : tensor<4xf32>
  }
}

// -----

// A receive and a collective in a cycle: rank 0 waits for rank 1's message,
// which rank 1 sends only after the collective rank 0 has not reached.
module attributes {tdx.pipeline = {axis = "pp", functions = [@a, @b], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2, 2] axes = ["dp", "pp"]
  func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.recv' op deadlocks: rank 0 (dp=0, pp=0) waits here for the message from rank 1 (dp=0, pp=1) with tag 0}}
    %g = tdx.recv on @mesh axes = ["pp"] from 1 tag 0 : tensor<4xf32>
    %s = tdx.all_reduce %g on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32>
    return %s : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-note @+1 {{rank 1 (dp=0, pp=1) waits here in 'tdx.all_reduce' for rank 0 (dp=0, pp=0) of its group}}
    %s = tdx.all_reduce %x on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32>
    tdx.send %s on @mesh axes = ["pp"] to 0 tag 0 : tensor<4xf32>
    return %s : tensor<4xf32>
  }
}

// -----

// One program every rank runs: its peers are absolute, so every rank sends
// to rank 0 and receives from it, and only rank 0 is sent anything.
module {
  tdx.mesh @mesh shape = [2] axes = ["cp"]
  func.func @ring(%x: tensor<4xf32>) -> tensor<4xf32> {
    tdx.send %x on @mesh axes = ["cp"] to 0 tag 0 : tensor<4xf32>
    // expected-error @+1 {{'tdx.recv' op never completes: rank 1 waits here for the message from rank 0 with tag 0, whose program ends without sending it (a deadlock)}}
    %a = tdx.recv on @mesh axes = ["cp"] from 0 tag 0 : tensor<4xf32>
    // expected-note @+1 {{rank 0's program ends here}}
    return %a : tensor<4xf32>
  }
}
