// Kernels for the launch-attribute and capture GPU tests (tile-launch/tests/gpu_config.rs,
// gpu_capture.rs, gpu_multi.rs). Compiled with NVRTC for compute_90; PTX only, no headers.

// out[linear block index] = the block's rank within its thread block cluster.
extern "C" __global__ void cluster_rank(float* out) {
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0) {
        out[blockIdx.x] = (float)rank;
    }
}

// A grid-wide barrier that only a cooperative launch (every block co-resident) can pass:
// phase 1 writes x[b] = b + 1, then every block waits for all others, then phase 2 reads the
// next block's value: y[b] = x[(b + 1) % gridDim.x]. `arrived` must be zero on entry.
extern "C" __global__ void grid_barrier(float* x, float* y, unsigned int* arrived) {
    unsigned int b = blockIdx.x;
    if (threadIdx.x == 0) {
        x[b] = (float)(b + 1);
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {
        }
        __threadfence();
        y[b] = *(volatile float*)&x[(b + 1) % gridDim.x];
    }
}

// The primary of a programmatic-dependent-launch pair: writes x[i] = i * 2, then lets the
// dependent grid start.
extern "C" __global__ void pdl_primary(float* x, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = (float)i * 2.0f;
    }
    __threadfence();
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The secondary: waits for the primary's memory (griddepcontrol.wait), then y[i] = x[i] + 1.
extern "C" __global__ void pdl_secondary(const float* x, float* y, unsigned long long n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[i] + 1.0f;
    }
}

// Uses `words` floats of dynamic shared memory: fills them, then block 0's thread 0 writes the
// sum of all of them (words * (words - 1) / 2) to out[0].
extern "C" __global__ void shared_sum(float* out, unsigned int words) {
    extern __shared__ float smem[];
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) {
        smem[i] = (float)i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (unsigned int i = 0; i < words; ++i) {
            s += smem[i];
        }
        out[0] = (float)s;
    }
}
