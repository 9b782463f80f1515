"""Host time of one cuLaunchKernel as a function of the kernel's by-value parameter size.

Compiles, with NVRTC, one kernel per size that takes a single struct of that many bytes, and
times batches of launches on one stream (synchronised between batches, so the launch queue
never fills): the median per-launch host time over the batches, in microseconds. The Python
call overhead is the same for every size, so the differences are the driver's.

    python3 bench/launch_param_cost.py [sizes...]
"""
import ctypes
import ctypes.util
import glob
import statistics
import sys
import time

SIZES = [int(s) for s in sys.argv[1:]] or [64, 256, 512, 1024, 2048, 2920, 4096]
BATCH, BATCHES = 1000, 15


def load(names):
    for name in names:
        for path in glob.glob(name) if "*" in name else [name]:
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    sys.exit(f"none of {names} could be loaded")


cuda = load(["libcuda.so.1", "libcuda.so"])
nvrtc = load(["libnvrtc.so", "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so*", "libnvrtc.so.13", "libnvrtc.so.12"])


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: {rc}")


def ptx_of(words):
    src = (
        f"struct A {{ unsigned long long v[{words}]; }};\n"
        'extern "C" __global__ void k(const A a) {\n'
        f"  if (threadIdx.x == 1000 && a.v[0] == 1 && a.v[{words - 1}] == 2) *(int*)0 = 1;\n"
        "}\n"
    ).encode()
    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None), "nvrtcCreateProgram")
    opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
    check(nvrtc.nvrtcCompileProgram(prog, 1, opts), "nvrtcCompileProgram")
    n = ctypes.c_size_t()
    check(nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(n.value)
    check(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    return buf


check(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
stream = ctypes.c_void_p()
check(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
launch = cuda.cuLaunchKernel
launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

print(f"{'param bytes':>11} {'us per launch':>13}")
for size in SIZES:
    words = max(1, size // 8)
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), ptx_of(words)), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(func), module, b"k"), "cuModuleGetFunction")
    arg = (ctypes.c_uint64 * words)(*range(3, 3 + words))
    params = (ctypes.c_void_p * 1)(ctypes.cast(arg, ctypes.c_void_p))
    per = []
    for b in range(BATCHES + 2):
        t = time.perf_counter()
        for _ in range(BATCH):
            rc = launch(func, 1, 1, 1, 32, 1, 1, 0, stream, params, None)
        dt = time.perf_counter() - t
        check(rc, "cuLaunchKernel")
        check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        if b >= 2:
            per.append(dt / BATCH * 1e6)
    print(f"{words * 8:>11} {statistics.median(per):>13.2f}")
