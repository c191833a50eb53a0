// RUN: tdx-opt %s -split-input-file -verify-diagnostics

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @annotate_type(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.annotate' op requires the same type for all operands and results}}
  %0 = "tdx.annotate"(%x) {sharding = #tdx.sharding<@mesh, [Shard(0)]>} : (tensor<8xf32>) -> tensor<4xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @annotate_priority(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.annotate' op priority must be >= 0 (0 is the highest)}}
  %0 = tdx.annotate %x <@mesh, [Shard(0)]> priority -1 : tensor<8xf32>
  return
}

// -----

tdx.mesh @a shape = [2] axes = ["tp"]
tdx.mesh @b shape = [2] axes = ["tp"]
func.func @redistribute_meshes(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.redistribute' op moves between meshes @a and @b; source and target must use one mesh}}
  %0 = tdx.redistribute %x <@a, [Shard(0)]> to <@b, [Replicate]> : tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @redistribute_target(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.redistribute' op target sharding places Shard(1) on mesh axis "tp" but the tensor 'tensor<8xf32>' has rank 1; valid shard dims are 0 to 0}}
  %0 = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Shard(1)]> : tensor<8xf32>
  return
}

// -----

func.func @collective_unknown_mesh(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.all_reduce' op refers to mesh @nope, which is not a 'tdx.mesh' in scope}}
  %0 = tdx.all_reduce %x on @nope axes = ["tp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @collective_unknown_axis(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.all_gather' op names axis "pp", which mesh @mesh does not have; its axes are "dp", "tp"}}
  %0 = tdx.all_gather %x on @mesh axes = ["pp"] dim = 0 : tensor<8xf32> -> tensor<16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @collective_repeated_axis(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.all_reduce' op names axis "tp" twice}}
  %0 = tdx.all_reduce %x on @mesh axes = ["tp", "tp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @collective_no_axes(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.all_reduce' op names no mesh axes; give at least one}}
  %0 = tdx.all_reduce %x on @mesh axes = [] reduce = sum : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @all_gather_shape(%x: tensor<2x16xf32>) {
  // expected-error @+1 {{'tdx.all_gather' op result dim 0 is 4 but a group of 4 rank(s) gives 8}}
  %0 = tdx.all_gather %x on @mesh axes = ["tp"] dim = 0 : tensor<2x16xf32> -> tensor<4x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @all_gather_dim(%x: tensor<2x16xf32>) {
  // expected-error @+1 {{'tdx.all_gather' op dim 2 is out of range for rank 2}}
  %0 = tdx.all_gather %x on @mesh axes = ["tp"] dim = 2 : tensor<2x16xf32> -> tensor<2x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @all_reduce_type(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.all_reduce' op result type 'tensor<8xf16>' must equal the input type 'tensor<8xf32>'}}
  %0 = tdx.all_reduce %x on @mesh axes = ["tp"] reduce = sum : tensor<8xf32> -> tensor<8xf16>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @all_reduce_kind(%x: tensor<8xf32>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'reduce' [sum, avg, max, min]}}
  %0 = tdx.all_reduce %x on @mesh axes = ["tp"] reduce = prod : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @reduce_scatter_uneven(%x: tensor<5x16xf32>) {
  // expected-error @+1 {{'tdx.reduce_scatter' op result dim 0 is 2 but a group of 4 rank(s) gives ? (an uneven torch.chunk split differs between ranks)}}
  %0 = tdx.reduce_scatter %x on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<5x16xf32> -> tensor<2x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @reduce_scatter_rank(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{'tdx.reduce_scatter' op result 'tensor<2xf32>' must keep the input's rank and element type 'tensor<8x16xf32>'}}
  %0 = tdx.reduce_scatter %x on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<8x16xf32> -> tensor<2xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @all_to_all_shape(%x: tensor<2x16xf32>) {
  // expected-error @+1 {{'tdx.all_to_all' op result dim 1 is 16 but a group of 4 rank(s) gives 4}}
  %0 = tdx.all_to_all %x on @mesh axes = ["tp"] split = 1 concat = 0 : tensor<2x16xf32> -> tensor<8x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @all_to_all_dim(%x: tensor<2x16xf32>) {
  // expected-error @+1 {{'tdx.all_to_all' op concat dim -3 is out of range for rank 2}}
  %0 = tdx.all_to_all %x on @mesh axes = ["tp"] split = 1 concat = -3 : tensor<2x16xf32> -> tensor<8x4xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @broadcast_root(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.broadcast' op root coordinate 4 on axis "tp" is outside [0, 4)}}
  %0 = tdx.broadcast %x on @mesh axes = ["tp"] root = [4] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @broadcast_root_count(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.broadcast' op root has 2 coordinate(s) for 1 mesh axes; give one coordinate per named axis}}
  %0 = tdx.broadcast %x on @mesh axes = ["tp"] root = [0, 0] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @permute_outside(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.collective_permute' op pair (3, 4) names rank 4, outside the group of 4 on axis "tp"}}
  %0 = tdx.collective_permute %x on @mesh axes = ["tp"] pairs = [3, 4] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @permute_two_targets(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.collective_permute' op rank 1 is the target of two pairs; each rank receives once}}
  %0 = tdx.collective_permute %x on @mesh axes = ["tp"] pairs = [0, 1, 2, 1] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @permute_two_sources(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.collective_permute' op rank 0 is the source of two pairs; each rank sends once}}
  %0 = tdx.collective_permute %x on @mesh axes = ["tp"] pairs = [0, 1, 0, 2] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @permute_odd(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.collective_permute' op pairs has 3 entries; give (source, target) pairs, flattened}}
  %0 = tdx.collective_permute %x on @mesh axes = ["tp"] pairs = [0, 1, 2] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @permute_two_axes(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.collective_permute' op names 2 mesh axes; a permutation goes along one}}
  %0 = tdx.collective_permute %x on @mesh axes = ["dp", "tp"] pairs = [0, 1] : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @permute_type(%x: tensor<8xf32>) {
  // expected-error @+1 {{'tdx.collective_permute' op requires the same type for all operands and results}}
  %0 = tdx.collective_permute %x on @mesh axes = ["tp"] pairs = [0, 1] : tensor<8xf32> -> tensor<4xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["pp", "tp"]
func.func @send_two_axes(%x: tensor<2xf32>) {
  // expected-error @+1 {{'tdx.send' op names 2 mesh axes; a point-to-point message goes along one}}
  tdx.send %x on @mesh axes = ["pp", "tp"] to 1 tag 0 : tensor<2xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["pp", "tp"]
func.func @send_peer(%x: tensor<2xf32>) {
  // expected-error @+1 {{'tdx.send' op peer 2 is not a coordinate of axis "pp" (size 2)}}
  tdx.send %x on @mesh axes = ["pp"] to 2 tag 0 : tensor<2xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2] axes = ["pp"]
func.func @recv_tag() -> tensor<2xf32> {
  // expected-error @+1 {{'tdx.recv' op tag -1 must be >= 0}}
  %0 = tdx.recv on @mesh axes = ["pp"] from 1 tag -1 : tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["pp"]
func.func @recv_two_open_dims() -> tensor<?x?xf32> {
  // expected-error @+1 {{'tdx.recv' op receives 'tensor<?x?xf32>', with more than one `?` dim: the message's size gives one}}
  %0 = tdx.recv on @mesh axes = ["pp"] from 1 tag 0 : tensor<?x?xf32>
  return %0 : tensor<?x?xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["pp"]
func.func @recv_axis() -> tensor<2xf32> {
  // expected-error @+1 {{'tdx.recv' op names axis "dp", which mesh @mesh does not have; its axes are "pp"}}
  %0 = tdx.recv on @mesh axes = ["dp"] from 1 tag 0 : tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @to_local_wrong_piece(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{'tdx.to_local' op has local type 'tensor<8x16xf32>', but 'tensor<8x16xf32>' under #tdx.sharding<@mesh, [Shard(0)]> is 'tensor<4x16xf32>' per rank}}
  %l = tdx.to_local %x <@mesh, [Shard(0)]> : tensor<8x16xf32> -> tensor<8x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @to_local_uneven(%x: tensor<7x16xf32>) {
  // expected-error @+1 {{'tdx.to_local' op splits 'tensor<7x16xf32>' unevenly under #tdx.sharding<@mesh, [Shard(0)]>; a manual region's pieces are equal (pad the tensor)}}
  %l = tdx.to_local %x <@mesh, [Shard(0)]> : tensor<7x16xf32> -> tensor<4x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @from_local_wrong_piece(%x: tensor<4x16xf32>) {
  // expected-error @+1 {{'tdx.from_local' op has local type 'tensor<4x16xf32>', but 'tensor<8x16xf32>' under #tdx.sharding<@mesh, [Replicate]> is 'tensor<8x16xf32>' per rank}}
  %g = tdx.from_local %x <@mesh, [Replicate]> : tensor<4x16xf32> -> tensor<8x16xf32>
  return
}

// -----

func.func @to_local_no_mesh(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{'tdx.to_local' op sharding refers to mesh @nowhere, which is not a 'tdx.mesh' in scope}}
  %l = tdx.to_local %x <@nowhere, [Shard(0)]> : tensor<8x16xf32> -> tensor<4x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_sizes_per_rank(%x: tensor<6x16xf32>, %o: tensor<2xi64>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op offsets and sizes must be tensor<4xi64> (one entry per rank of the group); they are 'tensor<2xi64>'}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["tp"] : tensor<6x16xf32>, tensor<2xi64> -> tensor<24x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_sizes_i32(%x: tensor<6x16xf32>, %o: tensor<4xi32>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op offsets and sizes must be tensor<4xi64>}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["tp"] : tensor<6x16xf32>, tensor<4xi32> -> tensor<24x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_rows_differ(%x: tensor<6x16xf32>, %o: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op rows of 'tensor<6x16xf32>' do not fit rows of 'tensor<24x8xf32>': dim 1 differs}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["tp"] : tensor<6x16xf32>, tensor<4xi64> -> tensor<24x8xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_dynamic(%x: tensor<?x16xf32>, %o: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op needs static buffers (its counts are values, its shapes are not)}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["tp"] : tensor<?x16xf32>, tensor<4xi64> -> tensor<24x16xf32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_scalar(%x: tensor<f32>, %o: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op moves rows of dim 0: its input and result need the same rank, at least 1}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["tp"] : tensor<f32>, tensor<4xi64> -> tensor<f32>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_dtype(%x: tensor<6x16xf32>, %o: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op result element type 'f16' is not the input's 'f32'}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["tp"] : tensor<6x16xf32>, tensor<4xi64> -> tensor<24x16xf16>
  return
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @ragged_axis(%x: tensor<6x16xf32>, %o: tensor<4xi64>) {
  // expected-error @+1 {{'tdx.ragged_all_to_all' op names axis "ep", which mesh @mesh does not have}}
  %0 = tdx.ragged_all_to_all %x, %o, %o, %o, %o on @mesh axes = ["ep"] : tensor<6x16xf32>, tensor<4xi64> -> tensor<24x16xf32>
  return
}
