"""kernels/cuda_text.py: CUDA source read as code, comments and literals never taken for it."""

from __future__ import annotations

from vramfabric.kernels.cuda_text import code_only, shared_declarations

SOURCE = r"""// launch: k<<<4, 64>>>(x)
/* a block comment with __syncthreads() and
   asm("trap;") in it */
const char* a = "k<<<1, 1>>> \" still a string";
const char c = '"';
const char* raw = R"x(<<< )" __shared__ )x";
__shared__ float tile[16][17], other[4];
extern __shared__ __align__(16) unsigned char smem[];
__global__ void k(float* out) {
  static __shared__ int count;
  out[0] = tile[0][0] + other[0] + count + smem[0];
}
"""


def test_comments_and_literals_are_blanked_with_offsets_and_lines_kept() -> None:
    # Given a source whose comments and strings look like launches, asm and barriers
    code = code_only(SOURCE)
    # Then none of that is left as code, and every offset and line is where it was
    assert len(code) == len(SOURCE) and code.count("\n") == SOURCE.count("\n")
    for word in ("<<<", "__syncthreads", "asm", "still a string", ")x"):
        assert word not in code, word
    assert code.index("__global__ void k") == SOURCE.index("__global__ void k")


def test_shared_declarations_are_found_with_their_names_and_scope() -> None:
    # Given file-scope and function-scope __shared__ variables, one of them dynamic
    found = shared_declarations(code_only(SOURCE))
    # Then each is found once (none in the raw string), with its names and its scope
    assert [(d.names, d.file_scope, d.dynamic) for d in found] == [
        (("tile", "other"), True, False),
        (("smem",), True, True),
        (("count",), False, False),
    ]
    assert found[1].element_type == "unsigned char"
