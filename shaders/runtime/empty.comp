#version 450
// Does nothing: measures the cost of a dispatch itself.
layout(local_size_x = 64) in;
void main() {}
