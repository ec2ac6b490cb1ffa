#pragma once
// The passes of a draw (shaders/sampling/): the top-k select, the nucleus passes and the draw
// itself, which sample_rows records over logits and screened_sample over a screened head's
// candidates.
#include <cstdint>
#include <memory>

#include "runtime/memory.hpp"
#include "runtime/sequence.hpp"
#include "runtime/tensor.hpp"

namespace bitnet::ops {

// A draw's scratch for up to `rows` rows of n values at once (sample_rows.comp's bindings 3 to 7
// and 9, sample_nucleus.comp's 2 to 6): the bins, masses, tickets and the nucleus's largest key
// reset themselves, so blocks of rows, and draws one after another, reuse it.
struct SampleScratch {
  Tensor bins, tickets, select, partial, nans, masses, nucleus;
  uint32_t chunks;
};

// selects: the top-k select or nucleus passes run (else their bins are not read, and each row's
// select state says "every value kept"); nucleus: the nucleus passes run.
SampleScratch sample_scratch(Sequence& sequence, int64_t rows, int64_t n, bool selects,
                             bool nucleus);

// Records sample_rows.comp's phases first_phase .. last_phase (0-2: the top_k select, 3: the draw)
// over `rows` rows of n values (logits and out bound at their first row, row0 their index in the
// whole array; row_stride values from one row to the next, 0: n), with sample_nucleus.comp's four
// passes before the draw where nucleus (top-p).
void record_sample(Sequence& sequence, const std::shared_ptr<Device>& device,
                   const SampleScratch& scratch, const BufferBinding& logits,
                   const BufferBinding& out, const Tensor& params, const Tensor& start, int64_t n,
                   int64_t offset, uint64_t row0, uint64_t rows, int64_t first_phase,
                   int64_t last_phase, bool nucleus = false, int64_t row_stride = 0);

// The step through params ([6]: 0, every row's; [rows, 8]: 8, each row's own) and through start
// ([1]: 0; one a row: 1) that the sampling shaders take.
struct SamplingStrides {
  uint32_t params, start;
};
SamplingStrides sampling_strides(const Tensor& params, const Tensor& start);

// The checks sample_rows and screened_sample share: params uint32 [6] or [rows, 8], start int32
// [1] or one a row ([rows]), both on `on`'s device, offset in [0, 2^32); UnsupportedError for
// top-p without 64-bit integer atomics.
void check_sampling(const Tensor& params, const Tensor& start, int64_t offset, int64_t rows,
                    const Tensor& on);
void check_top_p(const Device& device, bool top_p);
// ArgumentError naming how many NaNs the logits held (after the run).
void raise_if_nan_logits(const Tensor& nans);

}  // namespace bitnet::ops
