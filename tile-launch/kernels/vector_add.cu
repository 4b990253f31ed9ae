// Element-wise c[i] = a[i] + b[i] over n elements, for tensors with arbitrary element strides.
// Strides are in elements, as DLPack gives them; a contiguous vector has stride 1.
extern "C" __global__ void vector_add(const float* a, long long stride_a,
                                      const float* b, long long stride_b,
                                      float* c, long long stride_c,
                                      unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[(long long)i * stride_c] = a[(long long)i * stride_a] + b[(long long)i * stride_b];
    }
}

// Keeps the stream busy for about `ns` nanoseconds (one thread reads the global timer).
// Used by tests to hold a launch stream back so that premature release becomes visible.
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// Writes `value` into every element of x (n elements, contiguous).
extern "C" __global__ void fill(float* x, float value, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = value;
    }
}
