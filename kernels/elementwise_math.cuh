// Elementwise math shared by kernels/elementwise.cu and the generated fused kernels
// (backend/core/src/kernels/fused.rs): op codes and the per-op float and integer functions.
// Prepended after common.cuh; defines no kernels.

// ---------------------------------------------------------------------------------------
// unary

// Op codes (order of `UnaryOp`).
#define U_NEG 0
#define U_ABS 1
#define U_EXP 2
#define U_LOG 3
#define U_LOG1P 4
#define U_EXPM1 5
#define U_SQRT 6
#define U_RSQRT 7
#define U_RECIP 8
#define U_SIN 9
#define U_COS 10
#define U_TAN 11
#define U_TANH 12
#define U_SIGMOID 13
#define U_RELU 14
#define U_GELU 15
#define U_ERF 16
#define U_FLOOR 17
#define U_CEIL 18
#define U_ROUND 19
#define U_TRUNC 20
#define U_SIGN 21
#define U_SQUARE 22
#define U_ADD_SCALAR 23
#define U_MUL_SCALAR 24
#define U_POW_SCALAR 25
#define U_CLAMP 26
#define U_LEAKY_RELU 27

// Float unary math in CT (float or double); SUF is `f` for the float functions.
#define UNARY_FLOAT_MATH(NAME, CT, SUF)                                                        \
    __device__ __forceinline__ CT NAME(int op, CT x, CT p0, CT p1) {                           \
        switch (op) {                                                                          \
            case U_NEG: return -x;                                                             \
            case U_ABS: return fabs##SUF(x);                                                   \
            case U_EXP: return exp##SUF(x);                                                    \
            case U_LOG: return log##SUF(x);                                                    \
            case U_LOG1P: return log1p##SUF(x);                                                \
            case U_EXPM1: return expm1##SUF(x);                                                \
            case U_SQRT: return sqrt##SUF(x);                                                  \
            case U_RSQRT: return rsqrt##SUF(x);                                                \
            case U_RECIP: return (CT)1 / x;                                                    \
            case U_SIN: return sin##SUF(x);                                                    \
            case U_COS: return cos##SUF(x);                                                    \
            case U_TAN: return tan##SUF(x);                                                    \
            case U_TANH: return tanh##SUF(x);                                                  \
            case U_SIGMOID: return (CT)1 / ((CT)1 + exp##SUF(-x));                             \
            case U_RELU: return x < (CT)0 ? (CT)0 : x;                                         \
            case U_GELU: return (CT)0.5 * x * ((CT)1 + erf##SUF(x * (CT)0.70710678118654752440)); \
            case U_ERF: return erf##SUF(x);                                                    \
            case U_FLOOR: return floor##SUF(x);                                                \
            case U_CEIL: return ceil##SUF(x);                                                  \
            case U_ROUND: return rint##SUF(x);                                                 \
            case U_TRUNC: return trunc##SUF(x);                                                \
            case U_SIGN: return x > (CT)0 ? (CT)1 : (x < (CT)0 ? (CT)-1 : x);                  \
            case U_SQUARE: return x * x;                                                       \
            case U_ADD_SCALAR: return x + p0;                                                  \
            case U_MUL_SCALAR: return x * p0;                                                  \
            case U_POW_SCALAR: return pow##SUF(x, p0);                                         \
            case U_CLAMP: { CT t = x < p0 ? p0 : x; return t > p1 ? p1 : t; }                  \
            case U_LEAKY_RELU: return x < (CT)0 ? x * p0 : x;                                  \
            default: return x;                                                                 \
        }                                                                                      \
    }

UNARY_FLOAT_MATH(unary_math_f32, float, f)
UNARY_FLOAT_MATH(unary_math_f64, double, )

// Integer unary ops (computed in i64, wrapping; the host allows only these).
__device__ __forceinline__ i64 unary_math_int(int op, i64 x, i64 p0, i64 p1) {
    switch (op) {
        case U_NEG: return (i64)(0ull - (u64)x);
        case U_ABS: return x < 0 ? (i64)(0ull - (u64)x) : x;
        case U_SIGN: return x > 0 ? 1 : (x < 0 ? -1 : 0);
        case U_SQUARE: return (i64)((u64)x * (u64)x);
        case U_ADD_SCALAR: return (i64)((u64)x + (u64)p0);
        case U_MUL_SCALAR: return (i64)((u64)x * (u64)p0);
        case U_CLAMP: { i64 t = x < p0 ? p0 : x; return t > p1 ? p1 : t; }  // min(max(x, lo), hi)
        default: return x;
    }
}


// ---------------------------------------------------------------------------------------
// binary

// Op codes (order of `BinaryOp`).
#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_REM 4
#define B_POW 5
#define B_MAX 6
#define B_MIN 7
#define B_ATAN2 8
#define B_AND 9
#define B_OR 10
#define B_XOR 11
#define B_RELU_BWD 12
#define B_GELU_BWD 13

#define BINARY_FLOAT_MATH(NAME, CT, SUF)                                                       \
    __device__ __forceinline__ CT NAME(int op, CT a, CT b) {                                   \
        switch (op) {                                                                          \
            case B_ADD: return a + b;                                                          \
            case B_SUB: return a - b;                                                          \
            case B_MUL: return a * b;                                                          \
            case B_DIV: return a / b;                                                          \
            case B_REM: {                                                                      \
                CT r = fmod##SUF(a, b);                                                        \
                if (r != (CT)0 && ((r < (CT)0) != (b < (CT)0))) r += b;                        \
                return r;                                                                      \
            }                                                                                  \
            case B_POW: return pow##SUF(a, b);                                                 \
            case B_MAX: return (a > b || a != a) ? a : b;                                      \
            case B_MIN: return (a < b || a != a) ? a : b;                                      \
            case B_ATAN2: return atan2##SUF(a, b);                                             \
            case B_RELU_BWD: return b <= (CT)0 ? (CT)0 : a;                                    \
            case B_GELU_BWD: {                                                                 \
                /* a = dy, b = x: Burn's GELU derivative (of the tanh approximation). */        \
                CT x2 = b * b;                                                                 \
                CT t = tanh##SUF(b * ((CT)0.0356774 * x2 + (CT)0.797885));                     \
                CT inner2 = b * ((CT)0.0535161 * x2 + (CT)0.398942);                           \
                return a * ((CT)0.5 * t + (inner2 * ((CT)1 - t * t) + (CT)0.5));               \
            }                                                                                  \
            default: return a;                                                                 \
        }                                                                                      \
    }

BINARY_FLOAT_MATH(binary_math_f32, float, f)
BINARY_FLOAT_MATH(binary_math_f64, double, )

// Integer power by squaring (wrapping); negative exponents give 0 except for bases 1 / -1.
__device__ __forceinline__ i64 ipow(i64 a, i64 e) {
    if (e < 0) {
        if (a == 1) return 1;
        if (a == -1) return (e & 1) ? -1 : 1;
        return 0;
    }
    u64 r = 1, base = (u64)a;
    while (e > 0) {
        if (e & 1) r *= base;
        base *= base;
        e >>= 1;
    }
    return (i64)r;
}

__device__ __forceinline__ i64 binary_math_int(int op, i64 a, i64 b) {
    switch (op) {
        case B_ADD: return (i64)((u64)a + (u64)b);
        case B_SUB: return (i64)((u64)a - (u64)b);
        case B_MUL: return (i64)((u64)a * (u64)b);
        case B_DIV:
            if (b == 0) return 0;
            if (b == -1) return (i64)(0ull - (u64)a);  // no overflow trap on MIN / -1
            return a / b;                               // truncates toward zero
        case B_REM: {
            if (b == 0 || b == -1) return 0;
            i64 r = a % b;
            if (r != 0 && ((r < 0) != (b < 0))) r += b;  // sign of the divisor
            return r;
        }
        case B_POW: return ipow(a, b);
        case B_MAX: return a > b ? a : b;
        case B_MIN: return a < b ? a : b;
        case B_AND: return a & b;
        case B_OR: return a | b;
        case B_XOR: return a ^ b;
        default: return a;
    }
}

