#include "ops/linalg.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/recorder.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

constexpr uint32_t kPanel = 32;  // columns a diagonal block or panel takes
// A product splits its K over workgroups when it has fewer tiles than kSplitTiles, into splits of
// at least kSplitDepth (docs/PERFORMANCE.md).
constexpr int64_t kSplitTiles = 512, kSplitDepth = 256;
// A QR panel of kSteppedRows rows or more is factored a column a dispatch, kStepRows rows a
// workgroup (householder_step.comp); shorter ones by one workgroup (geqr2.comp).
constexpr int64_t kSteppedRows = 128, kStepRows = 16;

// A strided matrix operand (shaders/linalg/linalg_common.glsl's View), in elements.
struct View {
  uint32_t offset, batch, rows, cols;
};

View matrix_view(int64_t rows, int64_t cols, int64_t row0 = 0, int64_t col0 = 0) {
  return {static_cast<uint32_t>(row0 * cols + col0), static_cast<uint32_t>(rows * cols),
          static_cast<uint32_t>(cols), 1};
}

View transposed(View v) { return {v.offset, v.batch, v.cols, v.rows}; }

std::string variant(const char* base, DType dtype) {
  return std::string(base) + (dtype == DType::float64 ? "_f64" : "_f32");
}

uint32_t u32(int64_t value) { return static_cast<uint32_t>(value); }

// The unit roundoff's bound of a linalg dtype (float64 or float32).
double machine_epsilon(DType dtype) {
  return dtype == DType::float64 ? 2.220446049250313e-16 : 1.1920929e-07;
}

// The checks every decomposition makes of its matrix: float32 or float64 (float64 where the
// device has shaderFloat64), [B, M, N], sizes a View's 32-bit offsets hold.
void require_matrices(const Tensor& a, const char* name) {
  if (a.dtype() != DType::float32 && a.dtype() != DType::float64)
    throw DTypeError(std::string(name) + ": expected float32 or float64, got " +
                     std::string(dtype_name(a.dtype())));
  if (a.dtype() == DType::float64 && !a.device().feature("float64"))
    throw UnsupportedError("float64 needs shaderFloat64, which device '" + a.device().info().name +
                           "' lacks");
  if (a.shape().size() != 3)
    throw ShapeError(std::string(name) + ": expected [B, M, N], got " + shape_text(a.shape()));
  if (a.size() >= (uint64_t{1} << 31))
    throw ShapeError(std::string(name) + ": " + std::to_string(a.size()) +
                     " elements are over 2^31 - 1");
  if (a.device().info().subgroup_size < 4)
    throw UnsupportedError("linalg needs subgroups of at least 4 invocations");
}

struct Operand {
  BufferBinding buffer;
  View view;
};

// What gemm.comp's FACTOR variant needs to factor the diagonal block of order `order` at c's
// corner once the product is done.
struct CornerFactor {
  BufferBinding diag;
  View diag_view;
  BufferBinding info;
  uint32_t order, first;
};

// c = beta c + alpha a b, a [m, k] and b [k, n] (views), over `batch` matrices; lower: only c's
// lower triangle; factor: then the block at c's corner factored. A long k over few tiles of c
// (V^T A of a QR panel: 32 rows of c, k the panel's rows) is split over workgroups into partial
// products that sum_splits.comp adds up in order.
void gemm(Sequence& sequence, const std::shared_ptr<Device>& device, DType dtype, int64_t m,
          int64_t n, int64_t k, float alpha, float beta, const Operand& a, const Operand& b,
          const Operand& c, int64_t batch, bool lower = false, const CornerFactor* factor = nullptr,
          const BufferBinding* c_source = nullptr) {
  if (m == 0 || n == 0) return;
  const int64_t tiles = (m + 63) / 64 * ((n + 63) / 64) * batch;
  int64_t splits = 1, chunk = std::max<int64_t>(k, 1);
  if (!lower && k >= 2 * kSplitDepth && tiles < kSplitTiles) {
    splits = std::min({(k + kSplitDepth - 1) / kSplitDepth, (kSplitTiles + tiles - 1) / tiles,
                       int64_t{65535} / batch});
    chunk = (k + splits - 1) / splits;
    chunk = (chunk + 15) / 16 * 16;  // whole steps of gemm.comp's K loop
    splits = (k + chunk - 1) / chunk;
  }
  const int64_t total = batch * m * n;
  std::optional<Tensor> partial;
  if (splits > 1) partial = Tensor::empty(device, std::vector<int64_t>{splits, batch, m, n}, dtype);
  struct {
    uint32_t m, n, k;
    float alpha, beta;
    View a, b, c;
    uint32_t splits, k_chunk, split_stride;
    uint32_t order, first;  // FACTOR only
    View diag;
  } push{u32(m),
         u32(n),
         u32(k),
         splits > 1 ? 1.0f : alpha,
         splits > 1 ? 0.0f : beta,
         a.view,
         b.view,
         splits > 1 ? matrix_view(m, n) : c.view,
         u32(splits),
         u32(chunk),
         u32(total),
         factor ? factor->order : 0,
         factor ? factor->first : 0,
         factor ? factor->diag_view : View{}};
  Kernel kernel =
      Kernel::builtin(device, variant("gemm", dtype) + (factor ? "_factor" : ""), {{0, lower}});
  const BufferBinding bindings[] = {a.buffer,
                                    b.buffer,
                                    partial ? partial->binding() : c.buffer,
                                    c_source ? *c_source : c.buffer,
                                    factor ? factor->diag : c.buffer,
                                    factor ? factor->info : c.buffer};
  const auto grid =
      checked_grid(*device,
                   {static_cast<uint64_t>((n + 63) / 64), static_cast<uint64_t>((m + 63) / 64),
                    static_cast<uint64_t>(batch * splits)},
                   "a product of " + std::to_string(m) + " x " + std::to_string(n) + " matrices");
  // The plain variant's push constants stop before the FACTOR fields.
  const auto bytes = push_bytes(push);
  sequence.dispatch(
      kernel, grid, std::span(bindings, factor ? 6 : 4),
      std::span(bytes).first(factor ? bytes.size() : offsetof(decltype(push), order)));
  if (!partial) return;
  struct {
    uint32_t m, n, total, splits;
    float alpha, beta;
    View c;
  } sum{u32(m), u32(n), u32(total), u32(splits), alpha, beta, c.view};
  Kernel adder = Kernel::builtin(device, variant("sum_splits", dtype));
  BufferBinding sum_bindings[] = {partial->binding(), c.buffer};
  sequence.dispatch(adder, {workgroups(*device, static_cast<uint64_t>(total)), 1, 1}, sum_bindings,
                    push_bytes(sum));
}

uint32_t matrices(const Device& device, int64_t batch, const char* what) {
  return checked_grid(device, {static_cast<uint64_t>(batch), 1, 1}, what)[0];
}

// Raises LinAlgError for the first matrix whose info is set.
void raise_if_failed(const Tensor& info, const std::string& what) {
  std::vector<int32_t> values(info.size());
  info.download(values.data(), info.nbytes());
  for (size_t b = 0; b < values.size(); ++b)
    if (values[b] != 0)
      throw LinAlgError(what + " (matrix " + std::to_string(b) + " of the batch, order " +
                        std::to_string(values[b]) + ")");
}

Tensor zeroed_info(Sequence& sequence, const std::shared_ptr<Device>& device, int64_t batch) {
  Tensor info = Tensor::empty(device, std::vector<int64_t>{batch}, DType::int32);
  sequence.fill(info.binding(), 0);
  return info;
}

// The blocked Householder factorization of `work` [B, M, N] in place: R in its upper trapezoid,
// the reflectors of each panel in v [B, M, K] (panel columns, explicit, rows from the panel's
// first), the panels' T factors in t [B, panels, 32, 32].
struct Reflectors {
  Tensor v, t;
  int64_t k;
};

Reflectors householder(Sequence& sequence, const std::shared_ptr<Device>& device,
                       const Tensor& work) {
  const DType dtype = work.dtype();
  const int64_t batch = work.shape()[0], m = work.shape()[1], n = work.shape()[2];
  const int64_t k = std::min(m, n), panels = (k + kPanel - 1) / kPanel;
  Reflectors out{
      Tensor::empty(device, std::vector<int64_t>{batch, m, std::max<int64_t>(k, 1)}, dtype),
      Tensor::empty(
          device, std::vector<int64_t>{batch, std::max<int64_t>(panels, 1), kPanel, kPanel}, dtype),
      k};
  Tensor tau = Tensor::empty(device, std::vector<int64_t>{batch, std::max<int64_t>(k, 1)}, dtype);
  Tensor gram = Tensor::empty(device, std::vector<int64_t>{batch, kPanel, kPanel}, dtype);
  Tensor w1 = Tensor::empty(device, std::vector<int64_t>{batch, kPanel, n}, dtype);
  Tensor w2 = Tensor::empty(device, std::vector<int64_t>{batch, kPanel, n}, dtype);
  const uint32_t groups = matrices(*device, batch, "a batch of QR factorizations");
  // householder_step.comp's sums, [B, 2, row groups + 1, 32], for panels of kSteppedRows or more.
  std::optional<Tensor> sums;
  if (m >= kSteppedRows)
    sums = Tensor::empty(
        device, std::vector<int64_t>{batch, 2, (m + kStepRows - 1) / kStepRows + 1, kPanel}, dtype);
  const View whole = matrix_view(m, n);
  // A panel's workgroup: rows in groups of 32 invocations, up to 32 groups for tall panels (one
  // workgroup walks a whole panel, so more rows in flight is what makes it faster).
  const int64_t threads = std::clamp<int64_t>(
      (m + 31) / 32 * 32, 256,
      std::min<int64_t>(1024, device->limits().maxComputeWorkGroupInvocations / 32 * 32));
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t j0 = panel * kPanel, w = std::min<int64_t>(kPanel, k - j0), rows = m - j0;
    const View v_view = matrix_view(m, out.k, j0, j0);  // rows from j0, the panel's columns
    const View t_view{u32(panel * kPanel * kPanel), u32(panels * kPanel * kPanel), kPanel, 1};
    if (rows >= kSteppedRows) {  // a dispatch a column, the rows spread over workgroups
      const uint32_t row_groups = u32((rows + kStepRows - 1) / kStepRows);
      Kernel kernel = Kernel::builtin(device, variant("householder_step", dtype), {{0, kStepRows}});
      BufferBinding bindings[] = {work.binding(), out.v.binding(), tau.binding(), sums->binding()};
      for (int64_t step = 0; step <= w; ++step) {
        struct {
          uint32_t m, w, j0, step, tau_offset, tau_batch;
          View a, v;
        } push{u32(m), u32(w), u32(j0), u32(step), u32(j0), u32(out.k), whole, v_view};
        sequence.dispatch(kernel, {row_groups, groups, 1}, bindings, push_bytes(push));
      }
    } else {  // one workgroup walks the panel
      struct {
        uint32_t m, w, j0, tau_offset, tau_batch;
        View a, v;
      } push{u32(m), u32(w), u32(j0), u32(j0), u32(out.k), whole, v_view};
      Kernel kernel = Kernel::builtin(device, variant("geqr2", dtype), {{0, threads}});
      BufferBinding bindings[] = {work.binding(), out.v.binding(), tau.binding()};
      sequence.dispatch(kernel, {groups, 1, 1}, bindings, push_bytes(push));
    }
    const View g_view = matrix_view(kPanel, kPanel);
    gemm(sequence, device, dtype, w, w, rows, 1, 0, {out.v.binding(), transposed(v_view)},
         {out.v.binding(), v_view}, {gram.binding(), g_view}, batch);
    {
      struct {
        uint32_t w, tau_offset, tau_batch;
        View g, t;
      } push{u32(w), u32(j0), u32(out.k), g_view, t_view};
      Kernel kernel = Kernel::builtin(device, variant("larft", dtype));
      BufferBinding bindings[] = {gram.binding(), tau.binding(), out.t.binding()};
      sequence.dispatch(kernel, {groups, 1, 1}, bindings, push_bytes(push));
    }
    const int64_t rest = n - j0 - w;
    if (rest <= 0) continue;
    // The trailing columns: A2 -= V (T^T (V^T A2)).
    const View a2 = matrix_view(m, n, j0, j0 + w);
    const View w_view = matrix_view(kPanel, n);
    gemm(sequence, device, dtype, w, rest, rows, 1, 0, {out.v.binding(), transposed(v_view)},
         {work.binding(), a2}, {w1.binding(), w_view}, batch);
    gemm(sequence, device, dtype, w, rest, w, 1, 0, {out.t.binding(), transposed(t_view)},
         {w1.binding(), w_view}, {w2.binding(), w_view}, batch);
    gemm(sequence, device, dtype, rows, rest, w, -1, 1, {out.v.binding(), v_view},
         {w2.binding(), w_view}, {work.binding(), a2}, batch);
  }
  return out;
}

// x [B, M, C] := Q^T x (transpose) or Q x, with Q = H_0 ... H_{k-1} from the reflectors; columns
// from col0 (Q x: the columns of x before col0 hold zeros below the rows the panels touch).
void apply_q(Sequence& sequence, const std::shared_ptr<Device>& device, const Reflectors& q,
             const Tensor& x, bool transpose) {
  const DType dtype = x.dtype();
  const int64_t batch = x.shape()[0], m = x.shape()[1], cols = x.shape()[2];
  const int64_t panels = (q.k + kPanel - 1) / kPanel;
  Tensor w1 = Tensor::empty(device, std::vector<int64_t>{batch, kPanel, cols}, dtype);
  Tensor w2 = Tensor::empty(device, std::vector<int64_t>{batch, kPanel, cols}, dtype);
  for (int64_t step = 0; step < panels; ++step) {
    const int64_t panel = transpose ? step : panels - 1 - step;
    const int64_t j0 = panel * kPanel, w = std::min<int64_t>(kPanel, q.k - j0), rows = m - j0;
    // Q x from the identity: columns before j0 are still zero in rows j0 and below.
    const int64_t col0 = transpose ? 0 : std::min(j0, cols);
    const int64_t width = cols - col0;
    if (width <= 0) continue;
    const View v_view = matrix_view(m, q.k, j0, j0);
    const View t_view{u32(panel * kPanel * kPanel), u32(panels * kPanel * kPanel), kPanel, 1};
    const View x2 = matrix_view(m, cols, j0, col0);
    const View w_part = matrix_view(kPanel, cols, 0, col0);
    gemm(sequence, device, dtype, w, width, rows, 1, 0, {q.v.binding(), transposed(v_view)},
         {x.binding(), x2}, {w1.binding(), w_part}, batch);
    gemm(sequence, device, dtype, w, width, w, 1, 0,
         {q.t.binding(), transpose ? transposed(t_view) : t_view}, {w1.binding(), w_part},
         {w2.binding(), w_part}, batch);
    gemm(sequence, device, dtype, rows, width, w, -1, 1, {q.v.binding(), v_view},
         {w2.binding(), w_part}, {x.binding(), x2}, batch);
  }
}

Tensor copy_of(Sequence& sequence, const std::shared_ptr<Device>& device, const Tensor& a) {
  Tensor work = Tensor::empty(device, a.shape(), a.dtype());
  sequence.copy(a.binding(), work.binding());
  return work;
}

// What trapezoid() writes (trapezoid.comp's MODE).
enum class Fill { upper = 0, identity = 1, copy = 2 };

void trapezoid(Sequence& sequence, const std::shared_ptr<Device>& device, const Tensor& x,
               View view, const Tensor& out, Fill fill) {
  if (out.size() == 0) return;
  struct {
    uint32_t rows, cols, total;
    View x;
  } push{u32(out.shape()[1]), u32(out.shape()[2]), u32(out.size()), view};
  Kernel kernel =
      Kernel::builtin(device, variant("trapezoid", out.dtype()), {{0, static_cast<int64_t>(fill)}});
  BufferBinding bindings[] = {x.binding(), out.binding()};
  sequence.dispatch(kernel, {workgroups(*device, out.size()), 1, 1}, bindings, push_bytes(push));
}

constexpr int kMostSweeps = 40;

// Whether jacobi() sweeps n vectors of length len in one dispatch (in shared memory, small matrices
// sharing a workgroup: jacobi_layout), checked once after it; longer ones take a dispatch a round,
// and the host checks each sweep (in a Graph, which the host cannot stop, every sweep is recorded
// instead).
bool sweeps_in_one_dispatch(int64_t n, int64_t len) { return n <= 32 && len <= 64; }

// Whether a sweep rotated nothing in any matrix (its rotation counts all zero).
bool converged(const Tensor& counts) {
  std::vector<uint32_t> values(counts.size());
  counts.download(values.data(), counts.nbytes());
  return std::all_of(values.begin(), values.end(), [](uint32_t c) { return c == 0; });
}

// How jacobi_small.comp lays out a batch: invocations a pair (parts), matrices a workgroup (mats)
// and whether a round waits on its subgroup alone.
struct JacobiLayout {
  int64_t parts, mats, threads;
  bool subgroup_rounds;
};

// About 8 values of a row an invocation, and workgroups of about 64 invocations: a matrix's sweeps
// stop only when all of its workgroup's matrices converge, so fewer matrices a workgroup measured
// faster down to 64 invocations (docs/PERFORMANCE.md).
JacobiLayout jacobi_layout(const Device& device, int64_t batch, int64_t n, int64_t len,
                           DType dtype) {
  const int64_t pairs = (n + 1) / 2, scalar = dtype == DType::float64 ? 8 : 4;
  int64_t parts = 1;
  while (len > 8 * parts) parts *= 2;  // len <= 64: at most 8, 128 invocations a matrix
  // jacobi_small.comp's shared arrays for one matrix: rows len + 1 and n + 1 apart, a matrix
  // moved by 16 where its size is a multiple of 32, and the pair's partial sums.
  auto stride = [](int64_t size) { return size % 32 == 0 ? size + 16 : size; };
  const int64_t per_matrix =
      (stride(n * (len + 1)) + stride(n * (n + 1)) + 3 * pairs * parts) * scalar + 4;
  const int64_t fit =
      (static_cast<int64_t>(device.limits().maxComputeSharedMemorySize) - 4) / per_matrix;
  const int64_t mats = std::max<int64_t>(1, std::min({fit, 64 / (pairs * parts), batch}));
  const int64_t threads = mats * pairs * parts, subgroup = device.info().subgroup_size;
  return {parts, mats, threads, subgroup % (pairs * parts) == 0 && threads % subgroup == 0};
}

// One-sided Jacobi over the n rows (length len) of x [B, n, len], accumulating into vt [B, n, n]:
// sweeps until one rotates nothing.
void jacobi(const std::shared_ptr<Device>& device, const Tensor& x, const Tensor& vt, int64_t n,
            int64_t len, const char* what) {
  const int64_t batch = x.shape()[0], players = n + (n & 1);
  // A pair rotates while |g| > tol sqrt(a b): the rounding of a dot product of len terms.
  const float tol = static_cast<float>(machine_epsilon(x.dtype()) *
                                       static_cast<double>(std::max<int64_t>(len, 1)));
  Tensor rotations = Tensor::empty(device, std::vector<int64_t>{batch}, DType::uint32);
  const std::string unconverged =
      std::string(what) + " did not converge in " + std::to_string(kMostSweeps) + " Jacobi sweeps";
  if (sweeps_in_one_dispatch(n, len)) {  // every sweep in shared memory
    const JacobiLayout layout = jacobi_layout(*device, batch, n, len, x.dtype());
    struct {
      uint32_t sweeps;
      float tol;
      View x, v;
      uint32_t batch;
    } push{kMostSweeps, tol, matrix_view(n, len), matrix_view(n, n), u32(batch)};
    Recorder op(device);
    Kernel kernel = Kernel::builtin(device, variant("jacobi_small", x.dtype()),
                                    {{0, layout.threads},
                                     {1, n},
                                     {2, len},
                                     {3, layout.parts},
                                     {4, layout.mats},
                                     {5, layout.subgroup_rounds}});
    BufferBinding bindings[] = {x.binding(), vt.binding(), rotations.binding()};
    op.sequence().dispatch(
        kernel,
        {matrices(*device, (batch + layout.mats - 1) / layout.mats, "a batch of Jacobi sweeps"), 1,
         1},
        bindings, push_bytes(push));
    op.run([rotations, unconverged] {
      if (!converged(rotations)) throw LinAlgError(unconverged);
    });
    return;
  }
  const auto grid =
      checked_grid(*device, {static_cast<uint64_t>(players / 2), static_cast<uint64_t>(batch), 1},
                   "Jacobi rotations of " + std::to_string(n) + " vectors");
  Kernel kernel = Kernel::builtin(device, variant("jacobi", x.dtype()));
  // Sweep `sweep`'s rounds, counting into `counts`; with `previous`, skipping the matrices whose
  // sweep before rotated nothing.
  auto record_sweep = [&](Sequence& sequence, const Tensor& counts, const Tensor* previous) {
    sequence.fill(counts.binding(), 0);
    for (int64_t round = 0; round + 1 < players; ++round) {
      struct {
        uint32_t n, len, round;
        float tol;
        View x, v;
        uint32_t check_previous;
      } push{u32(n),
             u32(len),
             u32(round),
             tol,
             matrix_view(n, len),
             matrix_view(n, n),
             previous ? 1u : 0u};
      BufferBinding bindings[] = {x.binding(), vt.binding(), counts.binding(),
                                  (previous ? *previous : counts).binding()};
      sequence.dispatch(kernel, grid, bindings, push_bytes(push));
    }
  };
  if (device->recording_graph() != nullptr) {
    // Every sweep recorded; each skips the matrices that have converged, and the replay fails
    // where the last one still rotated.
    const Tensor counts[] = {rotations,
                             Tensor::empty(device, std::vector<int64_t>{batch}, DType::uint32)};
    Recorder op(device);
    for (int sweep = 0; sweep < kMostSweeps; ++sweep)
      record_sweep(op.sequence(), counts[sweep % 2], sweep == 0 ? nullptr : &counts[1 - sweep % 2]);
    op.run([last = counts[(kMostSweeps - 1) % 2], unconverged] {
      if (!converged(last)) throw LinAlgError(unconverged);
    });
    return;
  }
  for (int sweep = 0; sweep < kMostSweeps; ++sweep) {
    Recorder op(device);
    record_sweep(op.sequence(), rotations, nullptr);
    op.run();
    if (converged(rotations)) return;
  }
  throw LinAlgError(unconverged);
}

// singular.comp: s [B, n] from the rows of x; w (rank, e) = vt[i, e] through view vw where w is
// given; z (e, rank) = x_i / sigma_i through view vz where z is given.
void singular(Sequence& sequence, const std::shared_ptr<Device>& device, const Tensor& x,
              const Tensor& vt, const Tensor& shift, int64_t n, int64_t len, bool ascending,
              const Tensor& s, const Tensor* w, View vw, const Tensor* z, View vz) {
  const int64_t batch = x.shape()[0];
  Tensor sigma = Tensor::empty(device, std::vector<int64_t>{batch, n}, x.dtype());
  struct {
    uint32_t n, len;
    float cutoff;
    View x, v, w, z;
  } push{u32(n),
         u32(len),
         static_cast<float>(machine_epsilon(x.dtype()) * static_cast<double>(std::max(n, len))),
         matrix_view(n, len),
         matrix_view(n, n),
         vw,
         vz};
  Kernel kernel = Kernel::builtin(device, variant("singular", x.dtype()),
                                  {{0, ascending}, {1, w != nullptr}, {2, z != nullptr}});
  BufferBinding bindings[] = {
      x.binding(),     vt.binding(),   s.binding(), (w ? *w : s).binding(), (z ? *z : s).binding(),
      sigma.binding(), shift.binding()};
  sequence.dispatch(kernel, {matrices(*device, batch, "a batch of SVDs"), 1, 1}, bindings,
                    push_bytes(push));
}

}  // namespace

Tensor cholesky(const Tensor& a, bool upper, const std::optional<Tensor>& given) {
  require_matrices(a, "a");
  const int64_t batch = a.shape()[0], n = a.shape()[1];
  if (a.shape()[2] != n)
    throw ShapeError("a: expected square matrices [B, N, N], got " + shape_text(a.shape()));
  const auto& device = a.device_ptr();
  Tensor out = output(device, given, a.shape(), a.dtype(), "out", {&a});
  if (a.size() == 0) return out;
  const DType dtype = a.dtype();
  Recorder op(device);
  Sequence& sequence = op.sequence();
  Tensor info = zeroed_info(sequence, device, batch);
  if (n <= kPanel) {  // one block: a single pass from a to out
    struct {
      uint32_t n;
    } push{u32(n)};
    Kernel kernel = Kernel::builtin(device, variant("cholesky_small", dtype), {{0, upper}});
    BufferBinding bindings[] = {a.binding(), out.binding(), info.binding()};
    sequence.dispatch(kernel,
                      {matrices(*device, batch, "a batch of Cholesky factorizations"), 1, 1},
                      bindings, push_bytes(push));
    op.run([info] { raise_if_failed(info, "Matrix is not positive definite"); });
    return out;
  }
  // The first step reads a itself and writes the work matrix, so that a needs no copy: every
  // element of work's lower triangle that triangle.comp reads is written by the first step.
  Tensor work = Tensor::empty(device, a.shape(), dtype);
  auto source = [&](int64_t j0) { return j0 == 0 ? a.binding() : work.binding(); };
  // The factored diagonal blocks, [B, N, 32]: block j0 in rows j0 .. j0 + 31.
  Tensor diag = Tensor::empty(device, std::vector<int64_t>{batch, n, kPanel}, dtype);
  const uint32_t groups = matrices(*device, batch, "a batch of Cholesky factorizations");
  // Solves the panel of the w <= 32 columns from j0 against their diagonal block, factored here or
  // (factored) by the product before.
  auto factor_columns = [&](int64_t j0, int64_t w, bool factored) {
    const int64_t below = n - j0 - w;
    struct {
      uint32_t n, rows, first;
      View d, p, l;
    } push{u32(w),
           u32(below),
           u32(j0),
           matrix_view(n, n, j0, j0),
           matrix_view(n, n, j0 + w, j0),
           matrix_view(n, kPanel, j0, 0)};
    Kernel kernel = Kernel::builtin(device, variant("potrf_trsm", dtype), {{0, factored}});
    const int64_t tile = 64;  // TILE in potrf_trsm.comp: the panel rows a workgroup solves
    BufferBinding bindings[] = {work.binding(), diag.binding(), info.binding(), source(j0)};
    sequence.dispatch(kernel, {u32(std::max<int64_t>(1, (below + tile - 1) / tile)), groups, 1},
                      bindings, push_bytes(push));
  };
  // The lower triangle of the `rows` x `cols` block at (r0, r0) minus L L^T of the k columns from
  // c0 (A -= L21 L21^T of a blocked Cholesky); then the diagonal block of order `next` at (r0, r0)
  // factored, for the step that follows.
  auto update = [&](int64_t r0, int64_t rows, int64_t cols, int64_t c0, int64_t k, int64_t next) {
    const View l = matrix_view(n, n, r0, c0);
    const CornerFactor factor{diag.binding(), matrix_view(n, kPanel, r0, 0), info.binding(),
                              u32(next), u32(r0)};
    const BufferBinding from = source(c0);
    gemm(sequence, device, dtype, rows, cols, k, -1, 1, {work.binding(), l},
         {work.binding(), transposed(l)}, {work.binding(), matrix_view(n, n, r0, r0)}, batch, true,
         &factor, &from);
  };
  // Two blocks of 32 columns a step, the second's columns updated by the first alone, then the
  // trailing matrix by both (k = 64): it is read and written once every 64 columns, not 32. Each
  // product factors the diagonal block that comes next.
  bool factored = false;  // whether the block at j0 was factored by the product before
  for (int64_t j0 = 0; j0 < n; j0 += 2 * kPanel) {
    const int64_t w1 = std::min<int64_t>(kPanel, n - j0), below1 = n - j0 - w1;
    factor_columns(j0, w1, factored);
    if (below1 == 0) break;
    const int64_t w2 = std::min<int64_t>(kPanel, below1), below = below1 - w2;
    update(j0 + w1, below1, w2, j0, w1, w2);
    factor_columns(j0 + w1, w2, true);
    if (below == 0) break;
    update(j0 + w1 + w2, below, below, j0, w1 + w2, std::min<int64_t>(kPanel, below));
    factored = true;
  }
  {
    struct {
      uint32_t n, total;
    } push{u32(n), u32(out.size())};
    Kernel kernel = Kernel::builtin(device, variant("triangle", dtype), {{0, upper}});
    BufferBinding bindings[] = {work.binding(), diag.binding(), out.binding()};
    sequence.dispatch(kernel, {workgroups(*device, out.size()), 1, 1}, bindings, push_bytes(push));
  }
  op.run([info] { raise_if_failed(info, "Matrix is not positive definite"); });
  return out;
}

QrResult qr(const Tensor& a, bool complete, bool want_q) {
  require_matrices(a, "a");
  const int64_t batch = a.shape()[0], m = a.shape()[1], n = a.shape()[2];
  const int64_t k = std::min(m, n), q_cols = complete ? m : k, r_rows = complete ? m : k;
  const auto& device = a.device_ptr();
  const DType dtype = a.dtype();
  QrResult result{
      Tensor::empty(device, std::vector<int64_t>{batch, want_q ? m : 0, want_q ? q_cols : 0},
                    dtype),
      Tensor::empty(device, std::vector<int64_t>{batch, r_rows, n}, dtype)};
  if (a.size() == 0) {
    Recorder op(device);
    trapezoid(op.sequence(), device, a, matrix_view(m, n), result.q, Fill::identity);
    op.run();
    return result;
  }
  Recorder op(device);
  Sequence& sequence = op.sequence();
  Tensor work = copy_of(sequence, device, a);
  const Reflectors reflectors = householder(sequence, device, work);
  trapezoid(sequence, device, work, matrix_view(m, n), result.r, Fill::upper);
  if (want_q) {
    trapezoid(sequence, device, work, matrix_view(m, n), result.q, Fill::identity);
    apply_q(sequence, device, reflectors, result.q, false);
  }
  op.run();
  return result;
}

Tensor solve(const Tensor& a, const Tensor& b) {
  require_matrices(a, "a");
  require_matrices(b, "b");
  const int64_t batch = a.shape()[0], n = a.shape()[1], columns = b.shape()[2];
  if (a.shape()[2] != n)
    throw ShapeError("a: expected square matrices [B, N, N], got " + shape_text(a.shape()));
  if (b.dtype() != a.dtype() || b.shape()[0] != batch || b.shape()[1] != n)
    throw ShapeError("b: expected " + std::string(dtype_name(a.dtype())) + " [" +
                     std::to_string(batch) + ", " + std::to_string(n) + ", R], got " +
                     std::string(dtype_name(b.dtype())) + " " + shape_text(b.shape()));
  const auto& device = a.device_ptr();
  Tensor x = Tensor::empty(device, b.shape(), b.dtype());
  if (x.size() == 0 || n == 0) return x;
  Recorder op(device);
  Sequence& sequence = op.sequence();
  Tensor work = copy_of(sequence, device, a);
  sequence.copy(b.binding(), x.binding());
  Tensor info = zeroed_info(sequence, device, batch);
  const Reflectors reflectors = householder(sequence, device, work);
  apply_q(sequence, device, reflectors, x, true);
  {
    // A pivot below n eps of the largest is a singular matrix to working precision.
    const double eps = machine_epsilon(a.dtype());
    struct {
      uint32_t n;
      float tol;
      View r, y;
    } push{u32(n), static_cast<float>(eps * static_cast<double>(n)), matrix_view(n, n),
           matrix_view(n, columns)};
    Kernel kernel = Kernel::builtin(device, variant("trsv", a.dtype()));
    BufferBinding bindings[] = {work.binding(), x.binding(), info.binding()};
    const auto grid =
        checked_grid(*device, {static_cast<uint64_t>(columns), static_cast<uint64_t>(batch), 1},
                     "solve with " + std::to_string(columns) + " right-hand sides");
    sequence.dispatch(kernel, grid, bindings, push_bytes(push));
  }
  op.run([info] { raise_if_failed(info, "Singular matrix"); });
  return x;
}

}  // namespace bitnet::ops

namespace bitnet::ops {

SvdResult svd(const Tensor& a, bool full_matrices, bool compute_uv) {
  require_matrices(a, "a");
  const int64_t batch = a.shape()[0], m = a.shape()[1], n = a.shape()[2];
  if (m == 0 || n == 0) throw ShapeError("svd of empty matrices " + shape_text(a.shape()));
  const auto& device = a.device_ptr();
  const DType dtype = a.dtype();
  const bool tall = m >= n;
  const int64_t k = std::min(m, n), len = std::max(m, n);
  const std::vector<int64_t> none{batch, 0, 0};
  SvdResult result{
      Tensor::empty(
          device, compute_uv ? std::vector<int64_t>{batch, m, full_matrices ? m : k} : none, dtype),
      Tensor::empty(device, std::vector<int64_t>{batch, k}, dtype),
      Tensor::empty(device,
                    compute_uv ? std::vector<int64_t>{batch, full_matrices ? n : k, n} : none,
                    dtype)};
  // The k vectors Jacobi orthogonalizes: a's columns (rows of a^T) where tall, else a's rows.
  Tensor x = Tensor::empty(device, std::vector<int64_t>{batch, k, len}, dtype);
  Tensor vt = Tensor::empty(device, std::vector<int64_t>{batch, k, k}, dtype);
  Tensor shift = Tensor::empty(device, std::vector<int64_t>{batch}, dtype);
  {
    Recorder op(device);
    Sequence& sequence = op.sequence();
    trapezoid(sequence, device, a, tall ? transposed(matrix_view(m, n)) : matrix_view(m, n), x,
              Fill::copy);
    trapezoid(sequence, device, a, matrix_view(k, k), vt, Fill::identity);
    sequence.fill(shift.binding(), 0);
    op.run();
  }
  jacobi(device, x, vt, k, len, "SVD");
  std::optional<Tensor> z;
  if (compute_uv) z = Tensor::empty(device, std::vector<int64_t>{batch, len, k}, dtype);
  {
    Recorder op(device);
    // The accumulated rotations are v (tall: vh's rows) or u (wide: u's columns).
    const Tensor& w = tall ? result.vh : result.u;
    const View vw = tall ? matrix_view(n, n) : transposed(matrix_view(m, m));
    singular(op.sequence(), device, x, vt, shift, k, len, false, result.s,
             compute_uv ? &w : nullptr, vw, z ? &*z : nullptr, matrix_view(len, k));
    op.run();
  }
  if (!compute_uv) return result;
  // The normalized vectors, completed to an orthonormal basis with their signs.
  QrResult basis = qr(*z, full_matrices, true);
  Recorder op(device);
  Sequence& sequence = op.sequence();
  const int64_t q_cols = basis.q.shape()[2];
  {
    struct {
      uint32_t rows, count, total;
      View q, r;
    } push{u32(len), u32(k), u32(batch * len * k), matrix_view(len, q_cols),
           matrix_view(basis.r.shape()[1], k)};
    Kernel kernel = Kernel::builtin(device, variant("signs", dtype));
    BufferBinding bindings[] = {basis.q.binding(), basis.r.binding()};
    sequence.dispatch(kernel, {workgroups(*device, static_cast<uint64_t>(batch * len * k)), 1, 1},
                      bindings, push_bytes(push));
  }
  if (tall)
    sequence.copy(basis.q.binding(), result.u.binding());
  else
    trapezoid(sequence, device, basis.q, transposed(matrix_view(len, q_cols)), result.vh,
              Fill::copy);
  op.run();
  return result;
}

EighResult eigh(const Tensor& a, bool compute_v, bool upper) {
  require_matrices(a, "a");
  const int64_t batch = a.shape()[0], n = a.shape()[1];
  if (a.shape()[2] != n)
    throw ShapeError("a: expected square matrices [B, N, N], got " + shape_text(a.shape()));
  if (n == 0) throw ShapeError("eigh of empty matrices " + shape_text(a.shape()));
  const auto& device = a.device_ptr();
  const DType dtype = a.dtype();
  EighResult result{
      Tensor::empty(device, std::vector<int64_t>{batch, n}, dtype),
      Tensor::empty(
          device, compute_v ? std::vector<int64_t>{batch, n, n} : std::vector<int64_t>{batch, 0, 0},
          dtype)};
  Tensor x = Tensor::empty(device, std::vector<int64_t>{batch, n, n}, dtype);
  Tensor vt = Tensor::empty(device, std::vector<int64_t>{batch, n, n}, dtype);
  Tensor shift = Tensor::empty(device, std::vector<int64_t>{batch}, dtype);
  {
    Recorder op(device);
    Sequence& sequence = op.sequence();
    struct {
      uint32_t n;
      View a;
    } push{u32(n), upper ? transposed(matrix_view(n, n)) : matrix_view(n, n)};
    Kernel kernel = Kernel::builtin(device, variant("symmetric", dtype));
    BufferBinding bindings[] = {a.binding(), x.binding(), shift.binding()};
    sequence.dispatch(kernel, {matrices(*device, batch, "a batch of eigh"), 1, 1}, bindings,
                      push_bytes(push));
    trapezoid(sequence, device, a, matrix_view(n, n), vt, Fill::identity);
    op.run();
  }
  jacobi(device, x, vt, n, n, "Eigenvalues");
  Recorder op(device);
  singular(op.sequence(), device, x, vt, shift, n, n, true, result.w,
           compute_v ? &result.v : nullptr, transposed(matrix_view(n, n)), nullptr,
           matrix_view(n, n));
  op.run();
  return result;
}

}  // namespace bitnet::ops
