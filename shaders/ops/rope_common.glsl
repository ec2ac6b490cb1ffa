// The rotary embedding's rotation of one (first-half, second-half) pair of a head's values by the
// angle whose cosine and sine are c and s (half-split layout; shared by rope.comp,
// rope_append.comp and decode_attention.comp).
vec2 rope_rotate(float a, float b, float c, float s) { return vec2(a * c - b * s, a * s + b * c); }
