"""CUDA sources shared by the CUDA-kernel tests (unit, integration and GPU).

A grid-stride SAXPY, `y = a x + 1` over the chunk's float32s, as CUDA C++ and as the PTX
nvcc makes of it; and FAULT, a kernel that writes to an invalid device address (never run
on the host path: it would crash the process, as it poisons a GPU context).
"""

SAXPY = r"""
extern "C" __global__ void saxpy(const float* x, float* y, float a, unsigned long long n_bytes) {
    unsigned long long n = n_bytes / sizeof(float);
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        y[i] = a * x[i] + 1.0f;
    }
}
"""
# SAXPY as nvcc -ptx writes it, set to PTX ISA 7.0 and sm_52 so that any CUDA 11+ driver JITs
# it (checked with ptxas).
SAXPY_PTX = """
.version 7.0
.target sm_52
.address_size 64

.visible .entry saxpy(
    .param .u64 saxpy_param_0,
    .param .u64 saxpy_param_1,
    .param .f32 saxpy_param_2,
    .param .u64 saxpy_param_3
)
{
    .reg .pred %p<3>;
    .reg .f32 %f<4>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<19>;

    ld.param.u64 %rd9, [saxpy_param_0];
    ld.param.u64 %rd10, [saxpy_param_1];
    ld.param.f32 %f1, [saxpy_param_2];
    ld.param.u64 %rd11, [saxpy_param_3];
    mov.u32 %r1, %ntid.x;
    cvt.u64.u32 %rd1, %r1;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd12, %r2, %r1;
    mov.u32 %r3, %tid.x;
    cvt.u64.u32 %rd13, %r3;
    add.s64 %rd18, %rd12, %rd13;
    shr.u64 %rd3, %rd11, 2;
    setp.ge.u64 %p1, %rd18, %rd3;
    @%p1 bra $L__BB0_3;

    mov.u32 %r4, %nctaid.x;
    cvt.u64.u32 %rd14, %r4;
    mul.lo.s64 %rd4, %rd1, %rd14;
    cvta.to.global.u64 %rd5, %rd9;
    cvta.to.global.u64 %rd6, %rd10;

$L__BB0_2:
    shl.b64 %rd15, %rd18, 2;
    add.s64 %rd16, %rd5, %rd15;
    ld.global.f32 %f2, [%rd16];
    fma.rn.f32 %f3, %f2, %f1, 0f3F800000;
    add.s64 %rd17, %rd6, %rd15;
    st.global.f32 [%rd17], %f3;
    add.s64 %rd18, %rd18, %rd4;
    setp.lt.u64 %p2, %rd18, %rd3;
    @%p2 bra $L__BB0_2;

$L__BB0_3:
    ret;
}
"""
# Writes to an address no GPU maps: the GPU tests run it beside healthy leases.
FAULT = r"""
extern "C" __global__ void fault(const unsigned char* in, float* out, unsigned long long n) {
    float* nowhere = (float*)16;  // never a valid device address
    if (threadIdx.x == 0) nowhere[n] = 1.0f;
    out[threadIdx.x] = 0.0f;
}
"""
