//===- TdxOps.td - all tdx ops ------------------------------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXOPS_TD
#define TDX_DIALECT_TDXOPS_TD

include "TdxStructureOps.td"
include "TdxInitOps.td"
include "TdxElementwiseOps.td"
include "TdxNNOps.td"
include "TdxConvOps.td"
include "TdxShapeOps.td"
include "TdxShardingOps.td"
include "TdxGenericOps.td"
include "TdxBackendOps.td"

#endif // TDX_DIALECT_TDXOPS_TD
