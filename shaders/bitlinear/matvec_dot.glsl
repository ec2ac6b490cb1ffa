// The matvecs' inner step (bitlinear_matvec, bitlinear_chain). Needs bitlinear_common.glsl.

int dot16(uvec4 xv, uint word) {
  return dot4(xv.x, codes(word, 0)) + dot4(xv.y, codes(word, 1)) + dot4(xv.z, codes(word, 2)) +
         dot4(xv.w, codes(word, 3));
}

// acc += xv . (the 16 weights of `word`), xv an interleaved block of int8 activations. masked:
// each part i of the word masked in place (codes times 4^i, one AND) instead of shifted down and
// masked, multiplied as unsigned bytes (OpSUDot) into scaled[i - 1]; unscaled() shifts those sums
// down (exactly: sums of multiples of 4^i) once the row is done.
void dot_word(inout int acc, inout ivec3 scaled, uvec4 xv, uint word, bool masked) {
  if (masked) {
    acc += sudot4(xv.x, word & 0x03030303u);
    scaled.x += sudot4(xv.y, word & 0x0C0C0C0Cu);
    scaled.y += sudot4(xv.z, word & 0x30303030u);
    scaled.z += sudot4(xv.w, word & 0xC0C0C0C0u);
  } else {
    acc += dot16(xv, word);
  }
}

int unscaled(ivec3 scaled) { return (scaled.x >> 2) + (scaled.y >> 4) + (scaled.z >> 6); }
