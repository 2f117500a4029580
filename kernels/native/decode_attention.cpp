// servedeck's paged decode attention on CPU: one query token per row, read straight from the
// head-major KV pool ([kv_heads, num_blocks, block_size, head_dim], engine/kv_pool.py)
// through each row's block table, as vLLM's CPU backend does: no gathered copy.
//
// One pass per (row, KV head): the scores of the heads sharing that KV head (up to CHUNK at a
// time) from one read of each key, a softmax in float32, then one read of each value; a
// block's positions are one contiguous run. Only a row's own length is read. K/V are float32
// or bfloat16 (widened to float32 on load; a bfloat16 key's scores by VDPBF16PS where the CPU
// has AVX512_BF16); the query and the output are float32. Built and
// loaded by kernels/native.py; kernels/torch_attention.py's gathered batched products are the
// fallback and kernels/reference.py the oracle both are tested against.
//
// Two paths, chosen at compile time by -march=native: AVX-512 (16 float lanes) and, on a CPU
// without it, AVX2 with FMA (8 lanes; bfloat16 keys always widened to float32). They differ
// only in attend_item and its helpers; the walk over rows, the checks and the op are shared.
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
#error "the native decode attention needs AVX-512, or AVX2 with FMA (built with -march=native)"
#endif
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// One row's positions under one KV head: blocks of block_size contiguous [dim] rows.
template <typename T, int64_t DIM>
struct Paged {
  const T* head;         // this KV head's [num_blocks, block_size, DIM]
  const int64_t* table;  // this row's blocks, in order
  int64_t block_size;

  // f(first position, its row, rows): runs of up to block_size contiguous positions
  template <typename F>
  void runs(int64_t len, F&& f) const {
    for (int64_t start = 0, j = 0; start < len; start += block_size, ++j)
      f(start, head + table[j] * block_size * DIM, std::min(block_size, len - start));
  }

  template <typename F>
  void each(int64_t len, F&& f) const {
    for (int64_t start = 0, j = 0; start < len; start += block_size, ++j) {
      const T* block = head + table[j] * block_size * DIM;
      const int64_t n = std::min(block_size, len - start);
      for (int64_t t = 0; t < n; ++t) f(start + t, block + t * DIM);
    }
  }
};

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;  // floats per vector

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

inline __m512 exp16(__m512 x) {
  // e^x = 2^n * e^r, r = x - n ln2 in [-ln2/2, ln2/2]; degree-6 polynomial
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
  const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

constexpr int64_t CHUNK = 4;  // query heads per pass over one KV head's keys

// Lane i of the result: the sum of v[i]'s 16 lanes (a transposing tree: 45 instructions for
// 16 sums, against about 8 apiece one vector at a time).
inline __m512 sum16(const __m512* v) {
  __m512 r[8], w[4];
  for (int i = 0; i < 8; ++i)
    r[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(r[2 * i]), b = _mm512_castps_pd(r[2 * i + 1]);
    w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                                   _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
  const __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88),
                                   _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, 0x88), _mm512_shuffle_f32x4(y01, y23, 0xDD));
}

// x rounded to the nearest bfloat16 (ties to even), kept in float32
inline __m512 round_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// One pass's queries (up to CHUNK heads) against keys: dot(g, key) is a vector whose 16 lanes
// sum to head g's score for that key. Against bfloat16 keys the query is rounded to bfloat16
// first (as a bfloat16 model's query already is), so both paths below give the same scores.
// Widening: keys to float32, one FMA per 16 dims.
template <typename T, int64_t V, bool DP>
struct Queries {
  __m512 q[CHUNK][V];
  Queries(const float* qh, int64_t gn) {
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V; ++c) {
        const __m512 x = _mm512_loadu_ps(qh + g * V * 16 + c * 16);
        q[g][c] = std::is_same_v<T, uint16_t> ? round_bf16(x) : x;
      }
  }
  __m512 dot(int64_t g, const T* key) const {
    __m512 acc = _mm512_mul_ps(q[g][0], load16(key));
    for (int64_t c = 1; c < V; ++c) acc = _mm512_fmadd_ps(q[g][c], load16(key + c * 16), acc);
    return acc;
  }
};

#ifdef __AVX512BF16__
constexpr bool kBf16Dot = true;
// bfloat16 keys with AVX512_BF16: the query rounded to bfloat16 (exact where it came from a
// bfloat16 model) and one VDPBF16PS per 32 dims, products summed in float32.
template <int64_t V>
struct Queries<uint16_t, V, true> {
  __m512bh q[CHUNK][V / 2];
  Queries(const float* qh, int64_t gn) {
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V / 2; ++c) {
        const float* p = qh + g * V * 16 + c * 32;
        q[g][c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
      }
  }
  static __m512bh keys32(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  __m512 dot(int64_t g, const uint16_t* key) const {
    __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[g][0], keys32(key));
    for (int64_t c = 1; c < V / 2; ++c) acc = _mm512_dpbf16_ps(acc, q[g][c], keys32(key + c * 32));
    return acc;
  }
};
#else
constexpr bool kBf16Dot = false;
#endif

template <typename T, int64_t V>  // V: 16-float vectors per head (dim / 16)
void attend_item(const float* qh, const Paged<T, V * 16>& k, const Paged<T, V * 16>& v,
                 int64_t len, int64_t group, float scale, float* scores, float* o) {
  constexpr int64_t DIM = V * 16;
  for (int64_t g0 = 0; g0 < group; g0 += CHUNK) {
    const int64_t gn = std::min(CHUNK, group - g0);
    constexpr bool dp = kBf16Dot && std::is_same_v<T, uint16_t> && V % 2 == 0;
    const Queries<T, V, dp> q(qh + g0 * DIM, gn);
    const __m512 scale16 = _mm512_set1_ps(scale);
    k.runs(len, [&](int64_t start, const T* rows, int64_t n) {
      int64_t t = 0;
      for (; t + 16 <= n; t += 16) {  // 16 positions' scores per head at once
        for (int64_t g = 0; g < gn; ++g) {
          __m512 dots[16];
          for (int64_t u = 0; u < 16; ++u) dots[u] = q.dot(g, rows + (t + u) * DIM);
          _mm512_storeu_ps(scores + g * len + start + t, _mm512_mul_ps(sum16(dots), scale16));
        }
      }
      for (; t < n; ++t)
        for (int64_t g = 0; g < gn; ++g)
          scores[g * len + start + t] = _mm512_reduce_add_ps(q.dot(g, rows + t * DIM)) * scale;
    });
    for (int64_t g = 0; g < gn; ++g) {
      float* sg = scores + g * len;
      __m512 mv = _mm512_set1_ps(-INFINITY);
      int64_t s = 0;
      for (; s + 16 <= len; s += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sg + s));
      float m = _mm512_reduce_max_ps(mv);
      for (; s < len; ++s) m = sg[s] > m ? sg[s] : m;
      const __m512 mb = _mm512_set1_ps(m);
      __m512 tv = _mm512_setzero_ps();
      for (s = 0; s + 16 <= len; s += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + s), mb));
        _mm512_storeu_ps(sg + s, e);
        tv = _mm512_add_ps(tv, e);
      }
      if (s < len) {
        const __mmask16 tail = static_cast<__mmask16>((1u << (len - s)) - 1u);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sg + s), mb));
        e = _mm512_maskz_mov_ps(tail, e);
        _mm512_mask_storeu_ps(sg + s, tail, e);
        tv = _mm512_add_ps(tv, e);
      }
      const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(tv));
      for (s = 0; s + 16 <= len; s += 16)
        _mm512_storeu_ps(sg + s, _mm512_mul_ps(_mm512_loadu_ps(sg + s), inv));
      for (; s < len; ++s) sg[s] *= _mm512_cvtss_f32(inv);
    }
    __m512 acc[CHUNK][V];
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V; ++c) acc[g][c] = _mm512_setzero_ps();
    v.each(len, [&](int64_t s, const T* value) {
      __m512 vr[V];
      for (int64_t c = 0; c < V; ++c) vr[c] = load16(value + c * 16);
      for (int64_t g = 0; g < gn; ++g) {
        const __m512 p = _mm512_set1_ps(scores[g * len + s]);
        for (int64_t c = 0; c < V; ++c) acc[g][c] = _mm512_fmadd_ps(p, vr[c], acc[g][c]);
      }
    });
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V; ++c) _mm512_storeu_ps(o + (g0 + g) * DIM + c * 16, acc[g][c]);
  }
}

#else  // AVX2 with FMA
constexpr int64_t kLanes = 8;  // floats per vector
// The same steps as above on 8-lane vectors, V = dim / 8 of them per head. No VDPBF16PS here:
// a bfloat16 key is widened to float32 and scored against the query rounded to bfloat16, which
// is what the AVX-512 paths score too.

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline __m256 exp8(__m256 x) {
  // e^x = 2^n * e^r as exp16, 2^n built in the exponent field: x is clamped at -87 so that n
  // stays >= -126 (a normal float; e^-87 beside the maximum's e^0 is nothing to a softmax)
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
  const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
  r = _mm256_fnmadd_ps(n, ln2_lo, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

constexpr int64_t CHUNK = 4;  // query heads per pass over one KV head's keys

inline float reduce_add8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float reduce_max8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// Lane i of the result: the sum of v[i]'s 8 lanes (two rounds of pairwise sums, then the
// 128-bit halves added)
inline __m256 sum8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// x rounded to the nearest bfloat16 (ties to even), kept in float32
inline __m256 round_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Lanes below n set (0 <= n <= 8): a masked load's and store's mask
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The pool's blocks lie anywhere, a page or less each, and the hardware prefetcher stops at a
// page's end: while a block's positions are read, the same positions of the row's next block
// are asked for, a few lines at a time (keys and values cold, 7.4-9.1 -> 4.0-4.9 ms a layer in
// float32 on a 1-thread AVX2 EPYC; the whole block at once gained half as much).
inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(static_cast<const char*>(p) + b, _MM_HINT_T0);
}

// f(first position, its block's rows, the next block's rows (this one's at the end), rows)
template <typename T, int64_t DIM, typename F>
void blocks_ahead(const Paged<T, DIM>& p, int64_t len, F&& f) {
  for (int64_t start = 0, j = 0; start < len; start += p.block_size, ++j) {
    const T* block = p.head + p.table[j] * p.block_size * DIM;
    const T* next = start + p.block_size < len ? p.head + p.table[j + 1] * p.block_size * DIM : block;
    f(start, block, next, std::min(p.block_size, len - start));
  }
}

template <typename T, int64_t V>
struct Queries {
  __m256 q[CHUNK][V];
  Queries(const float* qh, int64_t gn) {
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V; ++c) {
        const __m256 x = _mm256_loadu_ps(qh + g * V * 8 + c * 8);
        q[g][c] = std::is_same_v<T, uint16_t> ? round_bf16(x) : x;
      }
  }
  __m256 dot(int64_t g, const T* key) const {
    __m256 acc = _mm256_mul_ps(q[g][0], load8(key));
    for (int64_t c = 1; c < V; ++c) acc = _mm256_fmadd_ps(q[g][c], load8(key + c * 8), acc);
    return acc;
  }
};

template <typename T, int64_t V>  // V: 8-float vectors per head (dim / 8)
void attend_item(const float* qh, const Paged<T, V * 8>& k, const Paged<T, V * 8>& v,
                 int64_t len, int64_t group, float scale, float* scores, float* o) {
  constexpr int64_t DIM = V * 8;
  for (int64_t g0 = 0; g0 < group; g0 += CHUNK) {
    const int64_t gn = std::min(CHUNK, group - g0);
    const Queries<T, V> q(qh + g0 * DIM, gn);
    const __m256 scale8 = _mm256_set1_ps(scale);
    blocks_ahead(k, len, [&](int64_t start, const T* rows, const T* next, int64_t n) {
      int64_t t = 0;
      for (; t + 8 <= n; t += 8) {  // 8 positions' scores per head at once
        prefetch(next + t * DIM, 8 * DIM * sizeof(T));
        for (int64_t g = 0; g < gn; ++g) {
          __m256 dots[8];
          for (int64_t u = 0; u < 8; ++u) dots[u] = q.dot(g, rows + (t + u) * DIM);
          _mm256_storeu_ps(scores + g * len + start + t, _mm256_mul_ps(sum8(dots), scale8));
        }
      }
      for (; t < n; ++t)
        for (int64_t g = 0; g < gn; ++g)
          scores[g * len + start + t] = reduce_add8(q.dot(g, rows + t * DIM)) * scale;
    });
    prefetch(v.head + v.table[0] * v.block_size * DIM, std::min(v.block_size, len) * DIM * sizeof(T));
    for (int64_t g = 0; g < gn; ++g) {
      float* sg = scores + g * len;
      __m256 mv = _mm256_set1_ps(-INFINITY);
      int64_t s = 0;
      for (; s + 8 <= len; s += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sg + s));
      float m = reduce_max8(mv);
      for (; s < len; ++s) m = sg[s] > m ? sg[s] : m;
      const __m256 mb = _mm256_set1_ps(m);
      __m256 tv = _mm256_setzero_ps();
      for (s = 0; s + 8 <= len; s += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + s), mb));
        _mm256_storeu_ps(sg + s, e);
        tv = _mm256_add_ps(tv, e);
      }
      if (s < len) {
        const __m256i tail = first_lanes(len - s);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(sg + s, tail), mb));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
        _mm256_maskstore_ps(sg + s, tail, e);
        tv = _mm256_add_ps(tv, e);
      }
      const float inv = 1.f / reduce_add8(tv);
      const __m256 inv8 = _mm256_set1_ps(inv);
      for (s = 0; s + 8 <= len; s += 8)
        _mm256_storeu_ps(sg + s, _mm256_mul_ps(_mm256_loadu_ps(sg + s), inv8));
      for (; s < len; ++s) sg[s] *= inv;
    }
    __m256 acc[CHUNK][V];
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V; ++c) acc[g][c] = _mm256_setzero_ps();
    blocks_ahead(v, len, [&](int64_t start, const T* rows, const T* next, int64_t n) {
      for (int64_t t = 0; t < n; ++t) {
        const T* value = rows + t * DIM;
        prefetch(next + t * DIM, DIM * sizeof(T));
        __m256 vr[V];
        for (int64_t c = 0; c < V; ++c) vr[c] = load8(value + c * 8);
        const float* sp = scores + start + t;
        for (int64_t g = 0; g < gn; ++g) {
          const __m256 p = _mm256_set1_ps(sp[g * len]);
          for (int64_t c = 0; c < V; ++c) acc[g][c] = _mm256_fmadd_ps(p, vr[c], acc[g][c]);
        }
      }
    });
    for (int64_t g = 0; g < gn; ++g)
      for (int64_t c = 0; c < V; ++c) _mm256_storeu_ps(o + (g0 + g) * DIM + c * 8, acc[g][c]);
  }
}
#endif

struct Shape {
  int64_t rows, kv_heads, group, num_blocks, block_size, width;
};

template <typename T, int64_t V>
void attend(const float* q, const T* keys, const T* values, const int64_t* tables,
            const int64_t* lens, float* out, const Shape& shape, float scale) {
  constexpr int64_t DIM = V * kLanes;
  const int64_t items = shape.rows * shape.kv_heads, group = shape.group;
  const int64_t per_head = shape.num_blocks * shape.block_size * DIM;
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(CHUNK * shape.width * shape.block_size);
    for (int64_t i = begin; i < end; ++i) {
      // 0, n-1, 1, n-2, ...: rows come sorted by length, so each thread's contiguous share
      // of i holds as many long rows as short ones
      const int64_t item = i % 2 == 0 ? i / 2 : items - 1 - i / 2;
      const int64_t row = item / shape.kv_heads, head = item % shape.kv_heads;
      const int64_t len = lens[row];
      float* o = out + item * group * DIM;
      if (len <= 0) {
        std::memset(o, 0, group * DIM * sizeof(float));
        continue;
      }
      const int64_t* table = tables + row * shape.width;
      const Paged<T, DIM> k{keys + head * per_head, table, shape.block_size};
      const Paged<T, DIM> v{values + head * per_head, table, shape.block_size};
      attend_item<T, V>(q + item * group * DIM, k, v, len, group, scale, scores.data(), o);
    }
  });
}

template <typename T>
void dispatch(const at::Tensor& q, const T* k, const T* v, const at::Tensor& tables,
              const at::Tensor& lens, at::Tensor& out, const Shape& shape, int64_t dim,
              float scale) {
  const float* qp = q.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  switch (dim) {
    case 16: return attend<T, 16 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    case 32: return attend<T, 32 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    case 48: return attend<T, 48 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    case 64: return attend<T, 64 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    case 80: return attend<T, 80 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    case 96: return attend<T, 96 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    case 128: return attend<T, 128 / kLanes>(qp, k, v, tp, lp, op, shape, scale);
    default: TORCH_CHECK(false, "head_dim ", dim, " is not one of 16, 32, 48, 64, 80, 96, 128");
  }
}

// query [rows, heads, dim] float32; k_storage, v_storage [kv_heads, num_blocks, block_size,
// dim] (the pool, head-major); block_tables [rows, width] int64 (padded past a row's blocks);
// seq_lens [rows] int64. Returns [rows, heads, dim] float32.
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& k_storage,
                                  const at::Tensor& v_storage, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && query.is_contiguous() && query.dim() == 3);
  TORCH_CHECK(k_storage.is_contiguous() && v_storage.is_contiguous() && k_storage.dim() == 4);
  TORCH_CHECK(k_storage.sizes() == v_storage.sizes());
  TORCH_CHECK(k_storage.scalar_type() == v_storage.scalar_type());
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous());
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && seq_lens.is_contiguous());
  const int64_t rows = query.size(0), heads = query.size(1), dim = query.size(2);
  const Shape shape{rows,
                    k_storage.size(0),
                    heads / k_storage.size(0),
                    k_storage.size(1),
                    k_storage.size(2),
                    block_tables.dim() == 2 ? block_tables.size(1) : 0};
  TORCH_CHECK(k_storage.size(3) == dim && heads % shape.kv_heads == 0);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == rows && seq_lens.numel() == rows);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  for (int64_t row = 0; row < rows; ++row) {  // every block read is in the pool
    TORCH_CHECK(lens[row] <= shape.width * shape.block_size, "row ", row, " is longer than its table");
    for (int64_t j = 0; j * shape.block_size < lens[row]; ++j) {
      const int64_t block = tables[row * shape.width + j];
      TORCH_CHECK(block >= 0 && block < shape.num_blocks, "row ", row, " names block ", block);
    }
  }
  auto out = at::empty({rows, heads, dim}, query.options());
  const float s = static_cast<float>(scale);
  if (k_storage.scalar_type() == at::kFloat) {
    dispatch<float>(query, k_storage.data_ptr<float>(), v_storage.data_ptr<float>(), block_tables,
                    seq_lens, out, shape, dim, s);
  } else {
    TORCH_CHECK(k_storage.scalar_type() == at::kBFloat16, "K/V must be float32 or bfloat16");
    const auto* k = reinterpret_cast<const uint16_t*>(k_storage.data_ptr<at::BFloat16>());
    const auto* v = reinterpret_cast<const uint16_t*>(v_storage.data_ptr<at::BFloat16>());
    dispatch<uint16_t>(query, k, v, block_tables, seq_lens, out, shape, dim, s);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(servedeck, m) {
  m.def(
      "paged_decode_attention(Tensor query, Tensor k_storage, Tensor v_storage, "
      "Tensor block_tables, Tensor seq_lens, float scale) -> Tensor");
  m.impl("paged_decode_attention", c10::DispatchKey::CPU, TORCH_FN(paged_decode_attention));
}
