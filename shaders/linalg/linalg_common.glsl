// The scalar type of the linalg kernels: double in the f64 variants (FLOAT64), float otherwise.
#ifdef FLOAT64
#extension GL_EXT_shader_explicit_arithmetic_types_float64 : require
#define SCALAR double
#else
#define SCALAR float
#endif

// A strided matrix operand: element (i, j) of matrix b at offset + b * batch + i * rows + j * cols
// (elements, not bytes), which names a transposed or sub-block view without copying.
struct View {
  uint offset;
  uint batch;
  uint rows;
  uint cols;
};

uint at(View v, uint b, uint i, uint j) { return v.offset + b * v.batch + i * v.rows + j * v.cols; }

// A Householder reflection as LAPACK's dlarfg makes it, from a column's top value alpha and sigma,
// the sum of squares below it: beta = -sign(alpha) sqrt(alpha^2 + sigma) (the new top value),
// tau = (beta - alpha) / beta and scale = 1 / (alpha - beta) (v = x scale below v's 1); where
// sigma = 0, no reflection (tau = 0, beta = alpha, scale = 0).
void reflector(SCALAR alpha, SCALAR sigma, out SCALAR beta, out SCALAR tau, out SCALAR scale) {
  beta = alpha;
  tau = 0;
  scale = 0;
  if (sigma != SCALAR(0)) {
    const SCALAR norm = sqrt(alpha * alpha + sigma);
    beta = alpha <= SCALAR(0) ? norm : -norm;
    tau = (beta - alpha) / beta;
    scale = SCALAR(1) / (alpha - beta);
  }
}
