// Cluster launches for the standalone probes (cluster_probe, split_layer_probe): the launch configuration of `grid`
// CTAs of `block` threads with `smem` bytes of dynamic shared memory in clusters of cs. `at` holds the attribute the
// configuration points to, so it must outlive the launch.
#pragma once
#include <cuda_runtime.h>

static cudaLaunchConfig_t probe_cluster_config(int grid, int block, size_t smem, int cs, cudaLaunchAttribute& at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = cs;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    return cfg;
}
