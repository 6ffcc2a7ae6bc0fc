"""GPU tests: CUDA kernels against their references; skipped without CUDA."""
