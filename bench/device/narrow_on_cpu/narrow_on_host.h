// What patch 0105's narrow MMQ kernel (mmq-narrow.cu, cut out by check.sh, with mmid.cu's ids helper for MUL_MAT_ID)
// needs beyond cuda_on_host.h to run on host threads: the vector and half types with their intrinsics, mma.sync of int8
// (m16n8k32, m16n8k16) and of halves (m16n8k16, f32 sums) as the PTX ISA lays out their fragments, cp.async into the
// block's dynamic shared memory, the warp ballot and width-limited shuffles, and the few pieces of ggml-cuda's host side
// the launches use (a pool that is host memory, one device with an H100's SM count and shared memory). The integer mma
// is exact; the half variant rounds to half where the GPU does and sums its products in float, in another order.
#pragma once

#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

// ---- types ------------------------------------------------------------------------------------------------------------
struct int2 {
    int x, y;
};
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float2 {
    float x, y;
};
static float2 make_float2(float x, float y) { return { x, y }; }

using half = _Float16;
struct half2 {
    _Float16 x, y;
};
static float __half2float(half h) { return (float) h; }
static float __half2float(uint16_t bits) { // a block's ggml_half as the C declarations hold it
    half h;
    std::memcpy(&h, &bits, sizeof(h));
    return (float) h;
}
static half   __float2half(float f) { return (half) f; }
static half2  __float2half2_rn(float f) { return { (half) f, (half) f }; }
static float2 __half22float2(half2 h) { return { (float) h.x, (float) h.y }; }
static half2  __low2half2(half2 h) { return { h.x, h.x }; }
static half2  __high2half2(half2 h) { return { h.y, h.y }; }
static half2  __hneg2(half2 h) { return { (half) -h.x, (half) -h.y }; }
static half2  __hsub2(half2 a, half2 b) { return { (half) ((float) a.x - (float) b.x), (half) ((float) a.y - (float) b.y) }; }
static half2  __hmul2(half2 a, half2 b) { return { (half) ((float) a.x * (float) b.x), (half) ((float) a.y * (float) b.y) }; }
static half2  __hfma2(half2 a, half2 b, half2 c) { // one rounding of the exact a*b + c (a float fma is exact here)
    return { (half) std::fma((float) a.x, (float) b.x, (float) c.x), (half) std::fma((float) a.y, (float) b.y, (float) c.y) };
}

static unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t) y << 32) | x;
    unsigned       r = 0;
    for (int i = 0; i < 4; i++) {
        r |= (unsigned) ((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    }
    return r;
}
static int   __popc(unsigned x) { return __builtin_popcount(x); }
static float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof(f));
    return f;
}
static int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, sizeof(i));
    return i;
}
static int max(int a, int b) { return a > b ? a : b; }

// ---- warp collectives beyond cuda_on_host.h's -------------------------------------------------------------------------
namespace narrow_on_host {
// each thread's deposit for a warp collective (up to 8 words), in two sets used in turn: one barrier a collective, since
// no lane can deposit twice before every lane of its warp has read the first deposit (the next collective's barrier)
inline std::vector<std::array<uint32_t, 8>> slots[2];
inline thread_local int                     turn = 0;

template <typename F> void warp_collective(const uint32_t * mine, int n, F && use) {
    const int warp = cuda_on_host::linear_thread / 32;
    auto &    set  = slots[turn];
    turn ^= 1;
    std::memcpy(set[cuda_on_host::linear_thread].data(), mine, n * sizeof(uint32_t));
    cuda_on_host::warp_barriers[warp]->arrive_and_wait();
    use(&set[warp * 32]);
}
inline std::vector<char> dynamic_smem; // the block's extern __shared__ memory (blocks run one at a time)
inline host_dim3         grid_dim;
} // namespace narrow_on_host
#define gridDim (narrow_on_host::grid_dim)

static unsigned __ballot_sync(unsigned, bool pred) {
    const uint32_t mine = pred;
    unsigned       mask = 0;
    narrow_on_host::warp_collective(&mine, 1, [&](const std::array<uint32_t, 8> * lanes) {
        for (int l = 0; l < 32; l++) {
            mask |= (lanes[l][0] & 1u) << l;
        }
    });
    return mask;
}

static int warp_reduce_sum(int x) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset);
    }
    return x;
}
template <int width> static int warp_reduce_any(int x) {
    for (int offset = width / 2; offset > 0; offset >>= 1) {
        x = __shfl_xor_sync(0xffffffff, x, offset) || x;
    }
    return x;
}
static int __shfl_sync(unsigned, int v, int src_lane, int width) { // lanes in groups of width
    const int lane = cuda_on_host::linear_thread % 32;
    return cuda_on_host::exchange(cuda_on_host::exchange_i, v, lane / width * width + src_lane % width);
}
static int __shfl_up_sync(unsigned, int v, int offset, int width) {
    const int lane = cuda_on_host::linear_thread % 32;
    return cuda_on_host::exchange(cuda_on_host::exchange_i, v, lane % width >= offset ? lane - offset : lane);
}
#define ggml_cuda_syncwarp() __syncwarp()

enum class block_reduce_method { MAX, SUM };
template <block_reduce_method m, unsigned block_size = 0> static float block_reduce(float val, float * shared_vals) {
    val = m == block_reduce_method::MAX ? warp_reduce_max(val) : warp_reduce_sum(val);
    const unsigned size = block_size == 0 ? blockDim.x : block_size;
    if (size > 32) {
        if (threadIdx.x % 32 == 0) {
            shared_vals[threadIdx.x / 32] = val;
        }
        __syncthreads();
        val = (int) (threadIdx.x % 32) < (int) (size / 32) ? shared_vals[threadIdx.x % 32] :
              m == block_reduce_method::MAX ? -INFINITY : 0.0f;
        val = m == block_reduce_method::MAX ? warp_reduce_max(val) : warp_reduce_sum(val);
    }
    return val;
}

// ---- mma.sync: lane (g, t) = (lane / 4, lane % 4) holds C rows g and g + 8, columns 2t and 2t + 1 -------------------
namespace narrow_on_host {
static int8_t byte_of(uint32_t w, int i) { return (int8_t) ((w >> (8 * i)) & 0xFF); }
static float  half_of(uint32_t w, int i) {
    uint16_t bits = (uint16_t) (w >> (16 * i));
    half     h;
    std::memcpy(&h, &bits, sizeof(h));
    return (float) h;
}
} // namespace narrow_on_host

// one warp's mma.sync of depth K: lane (g, t) sets C[row][col] for rows g and g + 8 and columns 2t and 2t + 1 to the sum
// over k of a(l, row, k) * b(l, col, k) (plus C's own value if accumulate), l holding every lane's fragment words
template <int K, typename T, int n, typename FA, typename FB>
static void mmqn_mma_on_warp(T (&c)[4], const uint32_t (&mine)[n], bool accumulate, FA && a, FB && b) {
    const int lane = cuda_on_host::linear_thread % 32, g = lane / 4, t = lane % 4;
    narrow_on_host::warp_collective(mine, n, [&](const std::array<uint32_t, 8> * l) {
        for (int o = 0; o < 4; o++) {
            const int row = g + 8 * (o / 2), col = 2 * t + o % 2;
            T         sum = accumulate ? c[o] : T(0);
            for (int k = 0; k < K; k++) {
                sum += a(l, row, k) * b(l, col, k);
            }
            c[o] = sum;
        }
    });
}

using mma_lanes = const std::array<uint32_t, 8> *;

// m16n8k32 s8: A regs row g / g+8 (a0, a1) at k 4t.. and the same rows at k 16 + 4t.. (a2, a3); B k 4t.. (b0), 16 + 4t.. (b1)
static void mmqn_mma_k32(int (&c)[4], const int (&a)[4], const int b0, const int b1) {
    using namespace narrow_on_host;
    const uint32_t mine[6] = { (uint32_t) a[0], (uint32_t) a[1], (uint32_t) a[2], (uint32_t) a[3], (uint32_t) b0, (uint32_t) b1 };
    mmqn_mma_on_warp<32>(c, mine, false,
        [](mma_lanes l, int row, int k) { return (int) byte_of(l[(row % 8) * 4 + (k % 16) / 4][(row >= 8) + 2 * (k >= 16)], k % 4); },
        [](mma_lanes l, int col, int k) { return (int) byte_of(l[col * 4 + (k % 16) / 4][4 + (k >= 16)], k % 4); });
}

// m16n8k16 s8: A regs row g (a0), g+8 (a1) at k 4t..; B k 4t.. (b0)
static void mmqn_mma_k16(int (&c)[4], const int (&a)[2], const int b0) {
    using namespace narrow_on_host;
    const uint32_t mine[3] = { (uint32_t) a[0], (uint32_t) a[1], (uint32_t) b0 };
    mmqn_mma_on_warp<16>(c, mine, false,
        [](mma_lanes l, int row, int k) { return (int) byte_of(l[(row % 8) * 4 + k / 4][row >= 8], k % 4); },
        [](mma_lanes l, int col, int k) { return (int) byte_of(l[col * 4 + k / 4][2], k % 4); });
}

// m16n8k16 f16, f32 sums added to c: A regs row g (a0), g+8 (a1) at k 2t.., the same at k 8 + 2t.. (a2, a3); B k 2t..
// (b.x), 8 + 2t.. (b.y)
static void mmqn_mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint2 b) {
    using namespace narrow_on_host;
    const uint32_t mine[6] = { a[0], a[1], a[2], a[3], b.x, b.y };
    mmqn_mma_on_warp<16>(c, mine, true,
        [](mma_lanes l, int row, int k) { return half_of(l[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2); },
        [](mma_lanes l, int col, int k) { return half_of(l[col * 4 + (k % 8) / 2][4 + (k >= 8)], k % 2); });
}

// cp.async into the dynamic shared memory: its "shared address" is the offset there. A copy lands when its thread
// waits for it, as late as the GPU may land it: a group of copies at a wait that leaves fewer groups in flight, every
// copy at cp.async.wait_all. A read of shared memory before the copying thread's wait sees the old bytes.
namespace narrow_on_host {
struct cp_copy {
    unsigned     dst;
    const void * src;
};
inline thread_local std::vector<std::vector<cp_copy>> cp_groups; // committed, oldest first
inline thread_local std::vector<cp_copy>              cp_open;   // since the last commit

inline void cp_land(std::vector<cp_copy> & copies) {
    for (const cp_copy & c : copies) {
        std::memcpy(dynamic_smem.data() + c.dst, c.src, 16);
    }
    copies.clear();
}
} // namespace narrow_on_host

static unsigned ggml_cuda_cvta_generic_to_shared(void * p) {
    return (unsigned) ((char *) p - narrow_on_host::dynamic_smem.data());
}
template <int preload> static void cp_async_cg_16(const unsigned dst, const void * src) {
    narrow_on_host::cp_open.push_back({ dst, src });
}
static void mmqn_cp_commit() {
    narrow_on_host::cp_groups.push_back(std::move(narrow_on_host::cp_open));
    narrow_on_host::cp_open.clear();
}
template <int n> static void mmqn_cp_wait() {
    auto & groups = narrow_on_host::cp_groups;
    while (groups.size() > (size_t) n) {
        narrow_on_host::cp_land(groups.front());
        groups.erase(groups.begin());
    }
}
static void cp_async_wait_all() {
    mmqn_cp_wait<0>();
    narrow_on_host::cp_land(narrow_on_host::cp_open);
}

template <int span> static void mmqn_prefetch(const char *, const char *, int, int) {}

#define ggml_cuda_pdl_lc()
#define AMPERE_MMA_AVAILABLE
#define NO_DEVICE_CODE std::abort()

static float ggml_cuda_op_silu_single(float x) { return x / (1.0f + std::exp(-x)); }
static float ggml_cuda_op_gelu_single(float x) {
    return 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

// ---- ggml-cuda's host side, as the launch uses it ----------------------------------------------------------------------
#define MATRIX_ROW_PADDING 512
typedef void * cudaStream_t;
#define CUDA_CHECK(x) ((void) (x))
static int cudaGetLastError() { return 0; }
#define CUDA_SET_SHARED_MEMORY_LIMIT(kernel, nbytes) ((void) 0)
static bool ampere_mma_available(int) { return true; }
#include "switches.inc" // ggml_cuda_env_int, ggml_cuda_clover_legacy (off), cut by check.sh

struct ggml_cuda_pool {};
template <typename T> struct ggml_cuda_pool_alloc {
    std::vector<T> buf;
    explicit ggml_cuda_pool_alloc(ggml_cuda_pool &) {}
    ggml_cuda_pool_alloc(ggml_cuda_pool &, size_t n) { alloc(n); }
    T * alloc(size_t n) {
        buf.assign(n, T{});
        return buf.data();
    }
    T * get() { return buf.data(); }
};
struct ggml_backend_cuda_context {
    ggml_cuda_pool p;
    ggml_cuda_pool & pool() { return p; }
    cudaStream_t     stream() { return nullptr; }
};
struct ggml_cuda_device_info {
    struct {
        int    nsm;
        size_t smpbo;
        int    cc;
        int    warp_size;
    } devices[1];
};
// an H100; NARROW_NSM=N gives it N SMs, so that a launch's CTAs each take several units of work, NARROW_SMPBO=B
// B bytes of shared memory a block (sm_86/89/120: 101376), so that the dense launches stage shorter chunks
static const ggml_cuda_device_info & ggml_cuda_info() {
    static const int                   nsm   = getenv("NARROW_NSM") ? atoi(getenv("NARROW_NSM")) : 132;
    static const size_t                smpbo = getenv("NARROW_SMPBO") ? atoll(getenv("NARROW_SMPBO")) : 227 * 1024;
    static const ggml_cuda_device_info info = { { { nsm, smpbo, 900, 32 } } };
    return info;
}
static int ggml_cuda_get_device() { return 0; }

struct ggml_cuda_kernel_launch_params {
    dim3         block_nums, block_dims;
    size_t       shmem;
    cudaStream_t stream;
    ggml_cuda_kernel_launch_params(dim3 n, dim3 d, size_t s, cudaStream_t st) : block_nums(n), block_dims(d), shmem(s), stream(st) {}
};
template <typename Kernel, typename... Args>
static void ggml_cuda_kernel_launch(Kernel kernel, const ggml_cuda_kernel_launch_params & p, Args &&... args) {
    // a GPU refuses a launch that asks for more shared memory than a block may have ("invalid argument")
    if (p.shmem > ggml_cuda_info().devices[0].smpbo) {
        fprintf(stderr, "launch of %zu bytes of shared memory, over the %zu a block may have\n", p.shmem,
                ggml_cuda_info().devices[0].smpbo);
        abort();
    }
    narrow_on_host::dynamic_smem.assign(p.shmem, 0);
    for (auto & set : narrow_on_host::slots) {
        set.assign((size_t) p.block_dims.x * p.block_dims.y * p.block_dims.z, {});
    }
    narrow_on_host::grid_dim = p.block_nums;
    cuda_on_host::launch(p.block_nums, p.block_dims, [&] { kernel(args...); });
}
