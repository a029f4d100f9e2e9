#map = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
module {
  func.func @main(%arg0: tensor<64x512xf32>) -> (tensor<64x512xf32>, tensor<64xf32>) {
    %zero = arith.constant 0.000000e+00 : f32
    %e = tensor.empty() : tensor<64x512xf32>
    %relu = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<64x512xf32>) outs(%e : tensor<64x512xf32>) {
    ^bb0(%in: f32, %out: f32):
      %m = arith.maximumf %in, %zero : f32
      linalg.yield %m : f32
    } -> tensor<64x512xf32>
    %r = tensor.empty() : tensor<64xf32>
    %init = linalg.fill ins(%zero : f32) outs(%r : tensor<64xf32>) -> tensor<64xf32>
    %sum = linalg.generic {indexing_maps = [#map, #row], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<64x512xf32>) outs(%init : tensor<64xf32>) {
    ^bb0(%in: f32, %acc: f32):
      %x = math.exp %in : f32
      %s = arith.addf %x, %acc : f32
      linalg.yield %s : f32
    } -> tensor<64xf32>
    return %relu, %sum : tensor<64x512xf32>, tensor<64xf32>
  }
}
