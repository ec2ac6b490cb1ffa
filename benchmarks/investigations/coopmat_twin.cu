// Is the tensor-core BitLinear kernel's speed at M = 2048 its design or NVIDIA's compilation of
// its Vulkan shader? A CUDA twin of shaders/bitlinear/bitlinear_coopmat.glsl (the same tiles,
// shared layout, 8 warps, register sets two K steps ahead, the ternary words expanded into shared
// memory between two barriers a step; mma.sync m16n8k32 s8 fed by ldmatrix, the instructions a
// subgroup-scope cooperative matrix can become), and variants of it, timed with CUDA events
// (chains of 20, median of 7) and checked against a naive kernel. Not Vulkan: Nsight Compute reads
// the counters of CUDA kernels only. Build and run on the lent GPU:
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/coopmat_twin \
//       benchmarks/investigations/coopmat_twin.cu && /tmp/coopmat_twin
//   ncu --clock-control none -k regex:twin /tmp/coopmat_twin --profile   # one launch each
//
// The variants: two workgroups of 4 warps a multiprocessor; the operand path alone (no MMAs,
// results wrong); int8 weights (no expansion); and int8 x int8 with the copies from memory to
// shared memory made asynchronous (cp.async, 3 or 4 buffers: what CUTLASS's pre-Hopper kernels
// do, and what Vulkan cannot express).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                             \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      printf("CUDA %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

// Codes i of a packed word (weights 4j + i, j = 0..3, the interleaved order of
// bitlinear_common.glsl) as signed int8 c - 1.
__device__ __forceinline__ uint32_t expand_word(uint32_t word, int i) {
  const uint32_t c = (word >> (2 * i)) & 0x03030303u;
  const uint32_t plus = (c >> 1) & 0x01010101u;
  const uint32_t minus = ~(c | (c >> 1)) & 0x01010101u;
  return plus | (minus * 0xFFu);
}
__device__ __forceinline__ uint4 expand(uint32_t w) {
  return make_uint4(expand_word(w, 0), expand_word(w, 1), expand_word(w, 2), expand_word(w, 3));
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void mma(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}

struct Problem {
  int M, K, N;
  const uint4* a;     // int8 [M, K]
  const uint32_t* w;  // packed ternary [N, K / 16]
  const uint4* b8;    // int8 [N, K]
  const float* scales;
  float* y;
  int* acc;  // nullptr: not written
};

// A TM x TN tile of WARPS warps (SR x WARPS / SR), K steps of 16 * BLOCKS. KIND 0: the twin
// (ternary weights, register sets two steps ahead, one shared buffer); 1: the same without MMAs;
// 2: the same with int8 weights; 3: int8 x int8 through cp.async into STAGES buffers.
template <int TM, int TN, int BLOCKS, int SR, int WARPS, int KIND, int STAGES = 1>
__global__ void __launch_bounds__(WARPS * 32) twin(Problem p) {
  constexpr int T = WARPS * 32, STRIDE = BLOCKS + 1, SC = WARPS / SR, WM = TM / SR, WN = TN / SC;
  constexpr int MI = WM / 16, NJ = WN / 8;
  constexpr int A_LOADS = TM * BLOCKS / T, B_LOADS = TN * BLOCKS / T;
  constexpr int STAGE = (TM + TN) * STRIDE;  // uint4: the A tile, then the B tile
  extern __shared__ uint4 smem[];
  const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
  const int wr = warp / SC, wc = warp % SC;
  const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN, blocks = p.K / 16;
  int acc[MI][NJ][4] = {};

  auto multiply = [&](int buffer) {
    const uint4* at = smem + buffer * STAGE;
    const uint4* bt = at + TM * STRIDE;
#pragma unroll
    for (int kk = 0; kk < BLOCKS / 2; ++kk) {  // 32 values a multiply
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        ldsm4(af[i], at + (wr * WM + 16 * i + lane % 8 + 8 * (lane / 8 % 2)) * STRIDE + 2 * kk +
                         lane / 16);
#pragma unroll
      for (int jj = 0; jj < NJ / 2; ++jj) {
        uint32_t bf[4];
        ldsm4(bf, bt + (wc * WN + 16 * jj + lane % 8 + 8 * (lane / 16)) * STRIDE + 2 * kk +
                      lane / 8 % 2);
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          if (KIND == 1) {  // keep the loads live
            acc[i][2 * jj][0] ^= af[i][0] ^ bf[0];
            acc[i][2 * jj + 1][0] ^= af[i][1] ^ bf[2];
          } else {
            mma(acc[i][2 * jj], af[i], bf[0], bf[1]);
            mma(acc[i][2 * jj + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    }
  };
  const int steps = blocks / BLOCKS;

  if constexpr (KIND == 3) {
    auto copy_step = [&](int step, int buffer) {
#pragma unroll
      for (int l = 0; l < A_LOADS; ++l) {
        const int e = thread + l * T, row = e / BLOCKS, block = step * BLOCKS + e % BLOCKS;
        copy16(smem + buffer * STAGE + row * STRIDE + e % BLOCKS,
               p.a + (size_t)(m0 + row) * blocks + block);
      }
#pragma unroll
      for (int l = 0; l < B_LOADS; ++l) {
        const int e = thread + l * T, row = e / BLOCKS, block = step * BLOCKS + e % BLOCKS;
        copy16(smem + buffer * STAGE + (TM + row) * STRIDE + e % BLOCKS,
               p.b8 + (size_t)(n0 + row) * blocks + block);
      }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < steps) copy_step(s, s);
      asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int s = 0; s < steps; ++s) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
      __syncthreads();  // step s has landed; every warp is done with step s - 1's buffer
      if (s + STAGES - 1 < steps) copy_step(s + STAGES - 1, (s + STAGES - 1) % STAGES);
      asm volatile("cp.async.commit_group;\n" ::);
      multiply(s % STAGES);
    }
  } else {
    // A K step's loads in registers, two steps ahead: named sets, as the shader has.
    uint4 a0[A_LOADS], a1[A_LOADS], b0[B_LOADS], b1[B_LOADS];
    uint32_t w0[B_LOADS], w1[B_LOADS];
    auto load = [&](int step, uint4(&A)[A_LOADS], uint32_t(&W)[B_LOADS], uint4(&B)[B_LOADS]) {
#pragma unroll
      for (int l = 0; l < A_LOADS; ++l) {
        const int e = thread + l * T;
        A[l] = p.a[(size_t)(m0 + e / BLOCKS) * blocks + step * BLOCKS + e % BLOCKS];
      }
#pragma unroll
      for (int l = 0; l < B_LOADS; ++l) {
        const int e = thread + l * T;
        const size_t at = (size_t)(n0 + e / BLOCKS) * blocks + step * BLOCKS + e % BLOCKS;
        if (KIND == 2)
          B[l] = p.b8[at];
        else
          W[l] = p.w[at];
      }
    };
    auto store = [&](uint4(&A)[A_LOADS], uint32_t(&W)[B_LOADS], uint4(&B)[B_LOADS]) {
      __syncthreads();  // every warp is done with the previous step's tiles
#pragma unroll
      for (int l = 0; l < A_LOADS; ++l) {
        const int e = thread + l * T;
        smem[(e / BLOCKS) * STRIDE + e % BLOCKS] = A[l];
      }
#pragma unroll
      for (int l = 0; l < B_LOADS; ++l) {
        const int e = thread + l * T;
        smem[(TM + e / BLOCKS) * STRIDE + e % BLOCKS] = KIND == 2 ? B[l] : expand(W[l]);
      }
      __syncthreads();
    };
    load(0, a0, w0, b0);
    if (steps > 1) load(1, a1, w1, b1);
    for (int s = 0; s < steps; s += 2) {
      store(a0, w0, b0);
      if (s + 2 < steps) load(s + 2, a0, w0, b0);
      multiply(0);
      if (s + 1 >= steps) break;
      store(a1, w1, b1);
      if (s + 3 < steps) load(s + 3, a1, w1, b1);
      multiply(0);
    }
  }

  // y = acc * gamma / s[m] (gamma 1), and the accumulators where asked.
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wr * WM + 16 * i + g + 8 * h, n = n0 + wc * WN + 8 * j + 2 * t4;
        const float s = 1.0f / p.scales[m];
        *reinterpret_cast<float2*>(p.y + (size_t)m * p.N + n) =
            make_float2(acc[i][j][2 * h] * s, acc[i][j][2 * h + 1] * s);
        if (p.acc)
          *reinterpret_cast<int2*>(p.acc + (size_t)m * p.N + n) =
              make_int2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
}

// acc[m][n] = the sum over a row's bytes of a[m] times the expanded row n (TERNARY) or b8[n].
__global__ void naive(Problem p, bool ternary) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= p.N) return;
  const int8_t* a = reinterpret_cast<const int8_t*>(p.a) + (size_t)m * p.K;
  const int8_t* b = reinterpret_cast<const int8_t*>(p.b8) + (size_t)n * p.K;
  int s = 0;
  for (int blk = 0; blk < p.K / 16; ++blk) {
    const uint4 e = expand(p.w[(size_t)n * (p.K / 16) + blk]);
    const uint32_t words[4] = {e.x, e.y, e.z, e.w};
    for (int q = 0; q < 16; ++q) {
      const int k = 16 * blk + q;
      s += int(a[k]) * (ternary ? int(int8_t(words[q / 4] >> (8 * (q % 4)))) : int(b[k]));
    }
  }
  p.acc[(size_t)m * p.N + n] = s;
}

template <int TM, int TN, int BLOCKS, int SR, int WARPS, int KIND, int STAGES = 1>
void run(const char* name, Problem p, const int* reference, bool profile) {
  auto kernel = twin<TM, TN, BLOCKS, SR, WARPS, KIND, STAGES>;
  const int threads = WARPS * 32, shared = STAGES * (TM + TN) * (BLOCKS + 1) * 16;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
  if (p.M % TM || p.N % TN || (p.K / 16) % BLOCKS) {
    printf("%-30s (%d, %d, %d) skipped: not whole tiles\n", name, p.M, p.K, p.N);
    return;
  }
  const dim3 grid(p.N / TN, p.M / TM);
  Problem timed = p;
  timed.acc = nullptr;
  if (profile) {
    kernel<<<grid, threads, shared>>>(timed);
    CHECK(cudaDeviceSynchronize());
    return;
  }
  const char* verdict = "(results wrong by design)";
  if (KIND != 1) {
    CHECK(cudaMemset(p.acc, 0x7f, (size_t)p.M * p.N * 4));  // poisoned
    kernel<<<grid, threads, shared>>>(p);
    CHECK(cudaDeviceSynchronize());
    std::vector<int> x((size_t)p.M * p.N), r(x.size());
    CHECK(cudaMemcpy(x.data(), p.acc, x.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(r.data(), reference, r.size() * 4, cudaMemcpyDeviceToHost));
    verdict = x == r ? "exact" : "DIFF";
  }
  cudaFuncAttributes attributes;
  CHECK(cudaFuncGetAttributes(&attributes, kernel));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int r = 0; r < 7; ++r) {
    CHECK(cudaEventRecord(e0));
    for (int c = 0; c < 20; ++c) kernel<<<grid, threads, shared>>>(timed);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms * 1000 / 20);
  }
  CHECK(cudaGetLastError());
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];
  printf(
      "%-30s (%d, %d, %d) %7.1f us %5.0f Tops/s  registers %3d, spilled %3d B, %d resident  %s\n",
      name, p.M, p.K, p.N, t, 2.0 * p.M * p.K * p.N / (t * 1e-6) / 1e12, attributes.numRegs,
      (int)attributes.localSizeBytes, resident, verdict);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
}

int main(int argc, char** argv) {
  const bool profile = argc > 1 && !strcmp(argv[1], "--profile");  // one launch each, first shape
  const int shapes[][3] = {
      {2048, 4096, 4096}, {2048, 2560, 6912}, {2048, 6912, 2560}, {2048, 2560, 3840}};
  for (const auto& shape : shapes) {
    if (profile && shape != shapes[0]) break;
    const int M = shape[0], K = shape[1], N = shape[2];
    uint64_t state = 12345 + N;
    auto next = [&]() {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return uint32_t(state >> 33);
    };
    std::vector<uint8_t> a((size_t)M * K), b8((size_t)N * K);
    std::vector<uint32_t> w((size_t)N * K / 16);
    for (auto& v : a) v = uint8_t(next());
    for (auto& v : b8) v = uint8_t(next());
    for (auto& v : w)
      for (int c = 0; c < 16; ++c) v |= (next() % 3) << (2 * c);  // codes 0..2
    std::vector<float> scales(M);
    for (auto& s : scales) s = 1.0f + next() % 100;
    Problem p{M, K, N};
    uint4 *da, *db8;
    uint32_t* dw;
    float *ds, *dy;
    int *dacc, *ternary_ref, *int8_ref;
    CHECK(cudaMalloc(&da, a.size()));
    CHECK(cudaMalloc(&db8, b8.size()));
    CHECK(cudaMalloc(&dw, w.size() * 4));
    CHECK(cudaMalloc(&ds, M * 4));
    CHECK(cudaMalloc(&dy, (size_t)M * N * 4));
    CHECK(cudaMalloc(&dacc, (size_t)M * N * 4));
    CHECK(cudaMalloc(&ternary_ref, (size_t)M * N * 4));
    CHECK(cudaMalloc(&int8_ref, (size_t)M * N * 4));
    CHECK(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db8, b8.data(), b8.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ds, scales.data(), M * 4, cudaMemcpyHostToDevice));
    p.a = da, p.b8 = db8, p.w = dw, p.scales = ds, p.y = dy;
    if (!profile) {
      for (int ternary = 0; ternary < 2; ++ternary) {
        Problem r = p;
        r.acc = ternary ? ternary_ref : int8_ref;
        naive<<<dim3((N + 127) / 128, M), 128>>>(r, ternary);
      }
      CHECK(cudaDeviceSynchronize());
    }
    p.acc = dacc;
    run<256, 128, 4, 4, 8, 0>("twin 256x128x64", p, ternary_ref, profile);
    run<128, 128, 8, 4, 8, 0>("twin 128x128x128", p, ternary_ref, profile);
    run<128, 128, 8, 2, 4, 0>("twin, 4 warps, 128x128x128", p, ternary_ref, profile);
    run<256, 128, 4, 4, 8, 1>("twin without MMAs 256x128x64", p, ternary_ref, profile);
    run<256, 128, 4, 4, 8, 2>("twin, int8 weights 256x128x64", p, int8_ref, profile);
    run<256, 128, 4, 4, 8, 3, 4>("cp.async 4 buffers 256x128x64", p, int8_ref, profile);
    run<128, 128, 4, 4, 8, 3, 4>("cp.async 4 buffers 128x128x64", p, int8_ref, profile);
    run<128, 128, 4, 2, 4, 3, 3>("cp.async 3 bufs 4w 128x128x64", p, int8_ref, profile);
    for (void* ptr : {(void*)da, (void*)db8, (void*)dw, (void*)ds, (void*)dy, (void*)dacc,
                      (void*)ternary_ref, (void*)int8_ref})
      CHECK(cudaFree(ptr));
  }
  return 0;
}
