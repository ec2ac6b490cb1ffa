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
