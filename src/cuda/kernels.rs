//! Reduction kernels, generated as CUDA C source per element type and
//! reduce op and compiled at run time with NVRTC.
//!
//! One kernel shape: `out[i] = in[0*count + i] op in[1*count + i] op ...`
//! over the `n` gathered copies of a chunk, grid-stride. The source needs no
//! header (NVRTC installs often lack the toolkit's include files): f16
//! converts through inline PTX `cvt`, bf16 through bit operations with
//! round-to-nearest-even, and integer sums and products wrap through
//! unsigned arithmetic, as the host kernels (numpy semantics) do. Avg sums,
//! then divides by `n` (integers truncate, like the host).
//!
//! Floating-point 16-bit types accumulate in f32 and round once, where the
//! host rounds after every step: results can differ in the last bit for
//! sums whose partial values are not exact.

use ringleader_core::{DType, ReduceOp};

/// How an element type is stored, accumulated, loaded and stored back.
struct TypeSpec {
    storage: &'static str,
    acc: &'static str,
    /// Expression turning `x` (storage) into the accumulator type.
    load: &'static str,
    /// Expression turning `a` (accumulator) into storage.
    store: &'static str,
    /// Unsigned type of the same width, for wrapping integer arithmetic.
    wrap: Option<&'static str>,
}

fn spec(dtype: DType) -> TypeSpec {
    let int = |storage, wrap| TypeSpec { storage, acc: storage, load: "x", store: "a", wrap: Some(wrap) };
    match dtype {
        DType::F32 => TypeSpec { storage: "float", acc: "float", load: "x", store: "a", wrap: None },
        DType::F64 => TypeSpec { storage: "double", acc: "double", load: "x", store: "a", wrap: None },
        DType::F16 => TypeSpec { storage: "unsigned short", acc: "float", load: "h2f(x)", store: "f2h(a)", wrap: None },
        DType::BF16 => {
            TypeSpec { storage: "unsigned short", acc: "float", load: "b2f(x)", store: "f2b(a)", wrap: None }
        }
        DType::I8 => int("signed char", "unsigned char"),
        DType::U8 => int("unsigned char", "unsigned char"),
        DType::I32 => int("int", "unsigned int"),
        DType::I64 => int("long long", "unsigned long long"),
    }
}

const HELPERS: &str = r#"
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
"#;

/// The kernel's name for `dtype` and `op`.
///
/// ```ignore
/// assert_eq!(kernel_name(DType::BF16, ReduceOp::Sum), "rl_reduce_bf16_sum");
/// ```
pub fn kernel_name(dtype: DType, op: ReduceOp) -> String {
    format!("rl_reduce_{}_{}", dtype.name(), op.name())
}

/// The combining expression of `a` and `v` (both accumulator type).
fn combine(t: &TypeSpec, op: ReduceOp) -> String {
    match (op, t.wrap) {
        (ReduceOp::Sum | ReduceOp::Avg, Some(u)) => format!("({acc})(({u})a + ({u})v)", acc = t.acc),
        (ReduceOp::Prod, Some(u)) => format!("({acc})(({u})a * ({u})v)", acc = t.acc),
        (ReduceOp::Sum | ReduceOp::Avg, None) => "a + v".into(),
        (ReduceOp::Prod, None) => "a * v".into(),
        // NaN propagates as on the host: a NaN operand wins.
        (ReduceOp::Min, None) => "(v < a || v != v) ? v : a".into(),
        (ReduceOp::Max, None) => "(v > a || v != v) ? v : a".into(),
        (ReduceOp::Min, Some(_)) => "v < a ? v : a".into(),
        (ReduceOp::Max, Some(_)) => "v > a ? v : a".into(),
    }
}

/// CUDA C source of the reduction kernel for `dtype` and `op`, with its name.
pub fn kernel_source(dtype: DType, op: ReduceOp) -> (String, String) {
    let t = spec(dtype);
    let name = kernel_name(dtype, op);
    let finish = match (op, t.wrap) {
        (ReduceOp::Avg, Some(_)) => format!("a = ({})(a / ({})n);", t.acc, t.acc),
        (ReduceOp::Avg, None) => format!("a = a / ({})n;", t.acc),
        _ => String::new(),
    };
    let src = format!(
        r#"{HELPERS}
extern "C" __global__ void {name}({s}* __restrict__ out, const {s}* __restrict__ in, unsigned long long count, int n) {{
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {{
        {s} x = in[i];
        {acc} a = {load};
        for (int r = 1; r < n; ++r) {{
            x = in[(unsigned long long)r * count + i];
            {acc} v = {load};
            a = {combine};
        }}
        {finish}
        out[i] = {store};
    }}
}}
"#,
        s = t.storage,
        acc = t.acc,
        load = t.load,
        store = t.store,
        combine = combine(&t, op),
    );
    (name, src)
}

/// Launch geometry for `count` elements: 256 threads a block, at most
/// 4096 blocks (grid-stride covers the rest).
pub fn launch_dims(count: usize) -> (u32, u32) {
    let threads = 256u32;
    let blocks = count.div_ceil(threads as usize).clamp(1, 4096) as u32;
    (blocks, threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    #[test]
    fn every_dtype_and_op_has_a_well_formed_kernel() {
        for dtype in DType::ALL {
            for op in OPS {
                let (name, src) = kernel_source(dtype, op);
                assert_eq!(name, format!("rl_reduce_{}_{}", dtype.name(), op.name()));
                assert!(src.contains(&format!("extern \"C\" __global__ void {name}(")), "{name}");
                assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}: unbalanced braces");
                assert_eq!(src.matches('(').count(), src.matches(')').count(), "{name}: unbalanced parentheses");
                assert!(!src.contains("#include"), "{name}: NVRTC may have no headers");
                assert_eq!(src.contains("a / ("), op == ReduceOp::Avg, "{name}");
            }
        }
    }

    #[test]
    fn types_convert_and_wrap_like_the_host() {
        let (_, f16) = kernel_source(DType::F16, ReduceOp::Sum);
        assert!(
            f16.contains("unsigned short* __restrict__ out")
                && f16.contains("float a = h2f(x);")
                && f16.contains("out[i] = f2h(a);")
        );
        let (_, bf) = kernel_source(DType::BF16, ReduceOp::Max);
        assert!(bf.contains("b2f(x)") && bf.contains("f2b(a)") && bf.contains("v != v"));
        let (_, i8s) = kernel_source(DType::I8, ReduceOp::Sum);
        assert!(i8s.contains("(signed char)((unsigned char)a + (unsigned char)v)"), "{i8s}");
        let (_, i64p) = kernel_source(DType::I64, ReduceOp::Prod);
        assert!(i64p.contains("(long long)((unsigned long long)a * (unsigned long long)v)"));
        let (_, iavg) = kernel_source(DType::I32, ReduceOp::Avg);
        assert!(iavg.contains("a = (int)(a / (int)n);"));
        let (_, favg) = kernel_source(DType::F64, ReduceOp::Avg);
        assert!(favg.contains("a = a / (double)n;"));
    }

    #[test]
    fn launch_geometry_covers_small_and_huge_counts() {
        assert_eq!(launch_dims(0), (1, 256));
        assert_eq!(launch_dims(257), (2, 256));
        assert_eq!(launch_dims(1 << 30), (4096, 256));
    }
}
