// The CUDA names that the kernels checked by check.sh use, on host threads, to run a kernel's own source on a
// machine without a GPU: one std::thread per CUDA thread of a block, the blocks one after another; barriers for
// __syncthreads and __syncwarp; a per-warp exchange buffer for the shuffles; a function's static arrays as the block's
// shared memory (one block runs at a time). Slow, and exact in what it checks: indices, synchronisation, reductions.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct host_dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct uint3 {
    unsigned x, y, z;
};

struct float4 {
    float x, y, z, w;
};

static float4 make_float4(float x, float y, float z, float w) { return { x, y, z, w }; }

namespace cuda_on_host {
inline thread_local host_dim3 thread_idx;
inline thread_local int       linear_thread;
inline host_dim3              block_idx, block_dim;
inline std::unique_ptr<std::barrier<>>              block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<float>                           exchange_f;
inline std::vector<int>                             exchange_i;

template <typename T> T exchange(std::vector<T> & buf, T v, int src_lane) {
    const int warp = linear_thread / 32;
    buf[linear_thread] = v;
    warp_barriers[warp]->arrive_and_wait();
    const T r = buf[warp * 32 + src_lane];
    warp_barriers[warp]->arrive_and_wait();
    return r;
}

// runs kernel() for every thread of every block of grid (blocks of whole warps): a host thread per CUDA thread of a
// block, kept for all blocks, which run one after another
inline void launch(host_dim3 grid, host_dim3 block, const std::function<void()> & kernel) {
    const int      n        = (int) (block.x * block.y * block.z);
    const unsigned n_blocks = grid.x * grid.y * grid.z;
    block_dim               = block;
    block_barrier           = std::make_unique<std::barrier<>>(n);
    warp_barriers.clear();
    for (int w = 0; w < n / 32; w++) {
        warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
    }
    exchange_f.assign(n, 0.0f);
    exchange_i.assign(n, 0);
    unsigned   b         = 0;
    const auto set_block = [&] { block_idx = { b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y) }; };
    set_block();
    const auto next = [&]() noexcept { // when every thread has finished block b
        if (++b < n_blocks) {
            set_block();
        }
    };
    std::barrier<decltype(next)> between_blocks(n, next);
    std::vector<std::thread>     threads;
    for (int t = 0; t < n; t++) {
        threads.emplace_back([&, t] {
            linear_thread = t;
            thread_idx    = { t % block.x, (t / block.x) % block.y, t / (block.x * block.y) };
            for (unsigned i = 0; i < n_blocks; i++) {
                kernel();
                between_blocks.arrive_and_wait();
            }
        });
    }
    for (std::thread & t : threads) {
        t.join();
    }
}
} // namespace cuda_on_host

#define threadIdx (cuda_on_host::thread_idx)
#define blockIdx  (cuda_on_host::block_idx)
#define blockDim  (cuda_on_host::block_dim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() cuda_on_host::block_barrier->arrive_and_wait()
#define __syncwarp()    cuda_on_host::warp_barriers[cuda_on_host::linear_thread / 32]->arrive_and_wait()
#define ggml_cuda_pdl_sync()

#define WARP_SIZE 32
static constexpr int ggml_cuda_get_physical_warp_size() { return WARP_SIZE; }

static float __shfl_xor_sync(unsigned, float v, int offset) {
    return cuda_on_host::exchange(cuda_on_host::exchange_f, v, (cuda_on_host::linear_thread % 32) ^ offset);
}
static int __shfl_xor_sync(unsigned, int v, int offset) {
    return cuda_on_host::exchange(cuda_on_host::exchange_i, v, (cuda_on_host::linear_thread % 32) ^ offset);
}
static float __shfl_sync(unsigned, float v, int src_lane) {
    return cuda_on_host::exchange(cuda_on_host::exchange_f, v, src_lane);
}
static float __shfl_up_sync(unsigned, float v, int offset) {
    const int lane = cuda_on_host::linear_thread % 32;
    return cuda_on_host::exchange(cuda_on_host::exchange_f, v, lane >= offset ? lane - offset : lane);
}

// Ampere's redux.sync: every lane gets the reduction over the warp's 32 values
template <typename F> static unsigned warp_redux(unsigned v, F f) {
    const int warp = cuda_on_host::linear_thread / 32;
    cuda_on_host::exchange_i[cuda_on_host::linear_thread] = (int) v;
    cuda_on_host::warp_barriers[warp]->arrive_and_wait();
    unsigned r = (unsigned) cuda_on_host::exchange_i[warp * 32];
    for (int l = 1; l < 32; l++) {
        r = f(r, (unsigned) cuda_on_host::exchange_i[warp * 32 + l]);
    }
    cuda_on_host::warp_barriers[warp]->arrive_and_wait();
    return r;
}
static unsigned __reduce_max_sync(unsigned, unsigned v) {
    return warp_redux(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
static unsigned __reduce_min_sync(unsigned, unsigned v) {
    return warp_redux(v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}
static unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, sizeof(u));
    return u;
}

template <int width = 32> static float warp_reduce_sum(float x) {
    for (int offset = width / 2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset);
    }
    return x;
}
template <int width = 32> static float warp_reduce_max(float x) {
    for (int offset = width / 2; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
    }
    return x;
}

using dim3 = host_dim3;
static float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static int min(int a, int b) { return a < b ? a : b; }
static int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }

// ggml-cuda's division by a constant: the divisor kept in z
static uint3 init_fastdiv_values(uint64_t d) { return { 0, 0, (unsigned) d }; }
static uint32_t fastdiv(uint32_t n, uint3 d) { return n / d.z; }
static uint32_t fastmodulo(uint32_t n, uint3 d) { return n % d.z; }
