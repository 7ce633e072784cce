//! Element types and the reduction kernels.
//!
//! The kernels are plain loops over slices of one concrete type, which the
//! compiler turns into SIMD code (see `benches/reduce.rs` for GB/s). On
//! x86-64 the sum and product loops are compiled twice, for the baseline
//! (SSE2, 16 bytes per instruction) and for AVX2 (32), and the CPU picks at
//! run time: a build for the baseline still runs AVX2 code where the CPU
//! has it.
//!
//! Buffers arrive as bytes because transports move bytes; a misaligned
//! buffer (which only raw C callers can produce) takes a slower unaligned
//! path instead of failing.

use crate::types::{DType, ReduceOp};
use bytemuck::Pod;
use half::{bf16, f16};

/// A type collectives can carry. Implemented for f32, f64, f16, bf16, i8, u8,
/// i32 and i64.
///
/// ```
/// use ringleader_core::{DType, Element};
/// assert_eq!(<f32 as Element>::DTYPE, DType::F32);
/// assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
/// ```
pub trait Element: Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The dtype tag of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, u8 => U8, i32 => I32, i64 => I64);

/// Arithmetic each element type needs for the five reduce ops.
trait Arith: Pod {
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn div_n(a: Self, n: usize) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn div_n(a: Self, n: usize) -> Self { a.wrapping_div(n as Self) }
        }
    )*};
}
arith_int!(i8, u8, i32, i64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { a * b }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn div_n(a: Self, n: usize) -> Self { a / (n as $t) }
        }
    )*};
}
arith_float!(f32, f64);

// Half-precision types compute in f32 and round once per element, as
// PyTorch's CPU kernels do.
macro_rules! arith_half {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() + b.to_f32()) }
            #[inline(always)] fn mul(a: Self, b: Self) -> Self { <$t>::from_f32(a.to_f32() * b.to_f32()) }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            #[inline(always)] fn div_n(a: Self, n: usize) -> Self { <$t>::from_f32(a.to_f32() / n as f32) }
        }
    )*};
}
arith_half!(f16, bf16);

#[inline(always)]
fn combine<T: Arith>(op: ReduceOp, a: T, b: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => T::add(a, b),
        ReduceOp::Prod => T::mul(a, b),
        ReduceOp::Min => T::min(a, b),
        ReduceOp::Max => T::max(a, b),
    }
}

/// Whether the AVX2 loops serve `op`. Not min and max: compiled for AVX2,
/// their compare-and-select loops came out several times slower (f32 min
/// and max, 256 KiB in cache: 7.3-7.8 GiB/s against 24-32 GiB/s for the
/// baseline loops, `cargo bench --bench reduce`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn wide(op: ReduceOp) -> bool {
    // std caches the CPUID answer: this is a load and a test.
    matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Prod) && std::is_x86_feature_detected!("avx2")
}

/// Up to this many bytes the plain loop runs: it finishes before the
/// wide one would have asked the CPU for its features (a small
/// collective's reduction is a few elements).
const NARROW_MAX: usize = 64;

/// `dst op= src` for a few elements as bytes (a small collective's): one
/// loop per op, each element read and written unaligned, with none of the
/// wide loops' casts and dispatch around it.
#[inline]
fn reduce_narrow<T: Arith>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => narrow_loop::<T>(dst, src, T::add),
        ReduceOp::Prod => narrow_loop::<T>(dst, src, T::mul),
        ReduceOp::Min => narrow_loop::<T>(dst, src, T::min),
        ReduceOp::Max => narrow_loop::<T>(dst, src, T::max),
    }
}

#[inline(always)]
fn narrow_loop<T: Arith>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) {
    let size = std::mem::size_of::<T>();
    for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
        let v = f(bytemuck::pod_read_unaligned(d), bytemuck::pod_read_unaligned(s));
        d.copy_from_slice(bytemuck::bytes_of(&v));
    }
}

/// `dst op= src` with the best loop this CPU runs.
#[allow(unsafe_code)]
fn reduce_typed<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of_val(dst) > NARROW_MAX && wide(op) {
        // SAFETY: `wide` checked that the CPU has AVX2.
        return unsafe { avx2::reduce_loop(op, dst, src) };
    }
    reduce_loop(op, dst, src)
}

/// `dst = a op b` with the best loop this CPU runs.
#[allow(unsafe_code)]
fn reduce3_typed<T: Arith>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of_val(dst) > NARROW_MAX && wide(op) {
        // SAFETY: `wide` checked that the CPU has AVX2.
        return unsafe { avx2::reduce3_loop(op, dst, a, b) };
    }
    reduce3_loop(op, dst, a, b)
}

/// The same loops, compiled with AVX2 enabled (inlined into these
/// functions, so the compiler vectorizes them 32 bytes wide).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use super::{Arith, ReduceOp};

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn reduce_loop<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
        super::reduce_loop(op, dst, src)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn reduce3_loop<T: Arith>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
        super::reduce3_loop(op, dst, a, b)
    }
}

// One monomorphic loop per (type, op): the match sits outside the loop so
// each loop body is a single vectorizable operation.
#[inline(always)]
fn reduce_loop<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    macro_rules! each {
        ($f:path) => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = $f(*d, *s);
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => each!(T::add),
        ReduceOp::Prod => each!(T::mul),
        ReduceOp::Min => each!(T::min),
        ReduceOp::Max => each!(T::max),
    }
}

#[inline(always)]
fn reduce3_loop<T: Arith>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    macro_rules! each {
        ($f:path) => {
            for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
                *d = $f(*x, *y);
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => each!(T::add),
        ReduceOp::Prod => each!(T::mul),
        ReduceOp::Min => each!(T::min),
        ReduceOp::Max => each!(T::max),
    }
}

fn reduce_bytes_typed<T: Arith>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    match (bytemuck::try_cast_slice_mut::<u8, T>(dst), bytemuck::try_cast_slice::<u8, T>(src)) {
        (Ok(d), Ok(s)) => reduce_typed(op, d, s),
        _ => {
            let size = std::mem::size_of::<T>();
            for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
                let v = combine::<T>(op, bytemuck::pod_read_unaligned(d), bytemuck::pod_read_unaligned(s));
                d.copy_from_slice(bytemuck::bytes_of(&v));
            }
        }
    }
}

fn reduce3_bytes_typed<T: Arith>(op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(a),
        bytemuck::try_cast_slice::<u8, T>(b),
    ) {
        (Ok(d), Ok(x), Ok(y)) => reduce3_typed(op, d, x, y),
        _ => {
            dst.copy_from_slice(a);
            reduce_bytes_typed::<T>(op, dst, b);
        }
    }
}

fn div_bytes_typed<T: Arith>(buf: &mut [u8], n: usize) {
    match bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        Ok(b) => b.iter_mut().for_each(|x| *x = T::div_n(*x, n)),
        Err(_) => {
            for c in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
                let v = T::div_n(bytemuck::pod_read_unaligned(c), n);
                c.copy_from_slice(bytemuck::bytes_of(&v));
            }
        }
    }
}

/// f16 converts to f32 in blocks (half's slice conversion uses F16C where
/// the CPU has it), combines, and rounds back once per element: the same
/// result as element by element, ten times faster.
trait HalfConv: Pod {
    fn to_f32s(src: &[Self], dst: &mut [f32]);
    fn from_f32s(src: &[f32], dst: &mut [Self]);
}

impl HalfConv for f16 {
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// Round to nearest even, keeping NaNs quiet; branch free, so loops over it
/// vectorize (half's `from_f32` branches per element).
#[inline(always)]
fn f32_to_bf16(f: f32) -> bf16 {
    let b = f.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) as u16) | 0x40;
    bf16::from_bits(if (b & 0x7fff_ffff) > 0x7f80_0000 { quiet } else { rounded })
}

/// `dst = (a or dst) op b` for bf16 in one fused loop per op.
fn reduce_bf16(op: ReduceOp, dst: &mut [bf16], a: Option<&[bf16]>, b: &[bf16]) {
    macro_rules! each {
        ($f:expr) => {
            match a {
                None => {
                    for (d, y) in dst.iter_mut().zip(b) {
                        *d = f32_to_bf16($f(bf16_to_f32(*d), bf16_to_f32(*y)));
                    }
                }
                Some(a) => {
                    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
                        *d = f32_to_bf16($f(bf16_to_f32(*x), bf16_to_f32(*y)));
                    }
                }
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => each!(|x: f32, y: f32| x + y),
        ReduceOp::Prod => each!(|x: f32, y: f32| x * y),
        ReduceOp::Min => each!(|x: f32, y: f32| if y < x { y } else { x }),
        ReduceOp::Max => each!(|x: f32, y: f32| if y > x { y } else { x }),
    }
}

const HALF_BLOCK: usize = 256;

/// `dst = (a or dst) op b` for half types, a block at a time.
fn reduce_half<H: HalfConv>(op: ReduceOp, dst: &mut [H], a: Option<&[H]>, b: &[H]) {
    let (mut x, mut y) = ([0f32; HALF_BLOCK], [0f32; HALF_BLOCK]);
    for (i, d) in dst.chunks_mut(HALF_BLOCK).enumerate() {
        let n = d.len();
        let at = i * HALF_BLOCK..i * HALF_BLOCK + n;
        H::to_f32s(a.map_or(&*d, |a| &a[at.clone()]), &mut x[..n]);
        H::to_f32s(&b[at], &mut y[..n]);
        reduce_typed(op, &mut x[..n], &y[..n]);
        H::from_f32s(&x[..n], d);
    }
}

/// Casts the operands of a half-type reduction; `None` when misaligned.
#[allow(clippy::type_complexity)]
fn cast_half<'a, H: Pod>(
    dst: &'a mut [u8],
    a: Option<&'a [u8]>,
    b: &'a [u8],
) -> Option<(&'a mut [H], Option<&'a [H]>, &'a [H])> {
    let d = bytemuck::try_cast_slice_mut::<u8, H>(dst).ok()?;
    let y = bytemuck::try_cast_slice::<u8, H>(b).ok()?;
    let x = match a {
        None => None,
        Some(a) => Some(bytemuck::try_cast_slice::<u8, H>(a).ok()?),
    };
    Some((d, x, y))
}

/// The block path for f16/bf16; `false` when it does not apply (another
/// dtype, or misaligned buffers, which take the generic path).
/// Whether [`try_half`] handles `dtype` (asked first: `try_half` sets up
/// its conversion buffers before it looks).
#[inline]
fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

fn try_half(dtype: DType, op: ReduceOp, dst: &mut [u8], a: Option<&[u8]>, b: &[u8]) -> bool {
    match dtype {
        DType::F16 => cast_half::<f16>(dst, a, b).map(|(d, x, y)| reduce_half(op, d, x, y)).is_some(),
        DType::BF16 => cast_half::<bf16>(dst, a, b).map(|(d, x, y)| reduce_bf16(op, d, x, y)).is_some(),
        _ => false,
    }
}

/// The bytes of whole `dtype` elements in the first `len`. Element sizes
/// are powers of two, so this masks where `len / size * size` would divide
/// by a size only known at run time, a division on every small reduction.
#[inline]
fn whole(dtype: DType, len: usize) -> usize {
    len & !(dtype.size() - 1)
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
        }
    };
}

/// `dst[i] = dst[i] op src[i]` over byte buffers holding `dtype` elements.
///
/// `Avg` sums here; [`finish_avg`] divides once at the end. Only whole
/// elements are combined: a trailing partial element (which callers never
/// pass) is left alone.
///
/// ```
/// use ringleader_core::{reduce::reduce_bytes, DType, ReduceOp};
/// let mut a = [1.0f32, 2.0];
/// let b = [10.0f32, 20.0];
/// reduce_bytes(DType::F32, ReduceOp::Sum, bytemuck::cast_slice_mut(&mut a), bytemuck::cast_slice(&b));
/// assert_eq!(a, [11.0, 22.0]);
/// ```
pub fn reduce_bytes(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    let n = whole(dtype, dst.len().min(src.len()));
    if n <= NARROW_MAX && !is_half(dtype) {
        return dispatch!(dtype, reduce_narrow, op, &mut dst[..n], &src[..n]);
    }
    if !(is_half(dtype) && try_half(dtype, op, &mut dst[..n], None, &src[..n])) {
        dispatch!(dtype, reduce_bytes_typed, op, &mut dst[..n], &src[..n])
    }
}

/// `dst[i] = a[i] op b[i]`: a reduction that also moves the data, saving a
/// copy where the result must land somewhere other than either input.
///
/// ```
/// use ringleader_core::{reduce::reduce3_bytes, DType, ReduceOp};
/// let (a, b, mut d) = ([3i32, -4], [5i32, 1], [0i32; 2]);
/// reduce3_bytes(DType::I32, ReduceOp::Max, bytemuck::cast_slice_mut(&mut d),
///               bytemuck::cast_slice(&a), bytemuck::cast_slice(&b));
/// assert_eq!(d, [5, 1]);
/// ```
pub fn reduce3_bytes(dtype: DType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    let n = whole(dtype, dst.len().min(a.len()).min(b.len()));
    if !(is_half(dtype) && try_half(dtype, op, &mut dst[..n], Some(&a[..n]), &b[..n])) {
        dispatch!(dtype, reduce3_bytes_typed, op, &mut dst[..n], &a[..n], &b[..n])
    }
}

/// Divides every element by `world_size`: the last step of an `Avg` reduction.
///
/// ```
/// use ringleader_core::{reduce::finish_avg, DType};
/// let mut v = [6.0f64, 9.0];
/// finish_avg(DType::F64, bytemuck::cast_slice_mut(&mut v), 3);
/// assert_eq!(v, [2.0, 3.0]);
/// ```
pub fn finish_avg(dtype: DType, buf: &mut [u8], world_size: usize) {
    if world_size <= 1 {
        return;
    }
    let n = whole(dtype, buf.len());
    dispatch!(dtype, div_bytes_typed, &mut buf[..n], world_size)
}

/// Typed form of [`reduce_bytes`].
///
/// ```
/// use ringleader_core::{reduce::reduce_slice, ReduceOp};
/// let mut a = [250u8, 3];
/// reduce_slice(ReduceOp::Sum, &mut a, &[10, 4]);
/// assert_eq!(a, [4, 7]); // wraps, as numpy's uint8 does
/// ```
pub fn reduce_slice<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    reduce_bytes(T::DTYPE, op, bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_elements_are_counted_as_a_division_would() {
        for d in DType::ALL {
            for len in 0..70 {
                assert_eq!(whole(d, len), len / d.size() * d.size(), "{d:?}, {len} bytes");
            }
        }
    }

    #[test]
    fn integer_ops_wrap_like_numpy() {
        let mut a = [i8::MAX, i8::MIN, 3];
        reduce_slice(ReduceOp::Sum, &mut a, &[1, -1, 4]);
        assert_eq!(a, [i8::MIN, i8::MAX, 7]);
        let mut p = [i32::MAX];
        reduce_slice(ReduceOp::Prod, &mut p, &[2]);
        assert_eq!(p, [-2]);
    }

    #[test]
    fn half_types_reduce_in_f32() {
        let mut a = [f16::from_f32(1.5), f16::from_f32(-2.0)];
        reduce_slice(ReduceOp::Max, &mut a, &[f16::from_f32(1.0), f16::from_f32(4.0)]);
        assert_eq!(a, [f16::from_f32(1.5), f16::from_f32(4.0)]);
        let mut b = [bf16::from_f32(3.0)];
        reduce_slice(ReduceOp::Prod, &mut b, &[bf16::from_f32(0.5)]);
        assert_eq!(b, [bf16::from_f32(1.5)]);
    }

    #[test]
    fn half_blocks_match_element_by_element() {
        // Every bf16 bit pattern against half's own conversion, including
        // NaNs, infinities, subnormals and rounding ties.
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let one = vec![bf16::from_f32(1.0 / 3.0); all.len()];
        let mut got = all.clone();
        reduce_slice(ReduceOp::Sum, &mut got, &one);
        for (i, (g, x)) in got.iter().zip(&all).enumerate() {
            let want = bf16::from_f32(x.to_f32() + one[i].to_f32());
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{x:?}: {g:?} vs {want:?}");
        }
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let third = vec![f16::from_f32(0.3); all.len()];
        let mut got = vec![f16::ZERO; all.len()];
        reduce3_bytes(
            DType::F16,
            ReduceOp::Max,
            bytemuck::cast_slice_mut(&mut got),
            bytemuck::cast_slice(&all),
            bytemuck::cast_slice(&third),
        );
        for (i, (g, x)) in got.iter().zip(&all).enumerate() {
            let want = f16::from_f32(if third[i].to_f32() > x.to_f32() { third[i].to_f32() } else { x.to_f32() });
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{x:?}: {g:?} vs {want:?}");
        }
    }

    #[test]
    fn misaligned_buffers_take_the_slow_path() {
        let mut raw = [0u8; 4 * 3 + 1];
        let src: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|f| f.to_le_bytes()).collect();
        raw[1..].copy_from_slice(&src);
        reduce_bytes(DType::F32, ReduceOp::Sum, &mut raw[1..], &src);
        let got: Vec<f32> = raw[1..].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, [2.0, 4.0, 6.0]);
    }

    /// Both compilations of the loops, on the same inputs, bit for bit:
    /// every op, every dtype they serve, lengths around the vector widths.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[allow(unsafe_code)]
    fn avx2_loops_agree_with_the_baseline_loops() {
        if !std::is_x86_feature_detected!("avx2") {
            eprintln!("no AVX2 on this CPU: only the baseline loops run here");
            return;
        }
        fn check<T: Arith + PartialEq + std::fmt::Debug>(from: impl Fn(i32) -> T) {
            let lens = (0..=70).chain([255, 1000, 4099]);
            for len in lens {
                let a: Vec<T> = (0..len).map(|i| from(i * 7 - 300)).collect();
                let b: Vec<T> = (0..len).map(|i| from(250 - i * 3)).collect();
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                    let (mut base, mut wide) = (a.clone(), a.clone());
                    reduce_loop(op, &mut base, &b);
                    // SAFETY: AVX2 was detected above.
                    unsafe { avx2::reduce_loop(op, &mut wide, &b) };
                    assert_eq!(base, wide, "{op:?} len {len}");
                    let (mut base3, mut wide3) = (vec![from(0); len as usize], vec![from(0); len as usize]);
                    reduce3_loop(op, &mut base3, &a, &b);
                    // SAFETY: as above.
                    unsafe { avx2::reduce3_loop(op, &mut wide3, &a, &b) };
                    assert_eq!(base3, wide3, "{op:?} len {len} (three operands)");
                    assert_eq!(base3, base, "{op:?} len {len}: a op b either way");
                }
            }
        }
        check(|i| i as f32 * 0.37);
        check(|i| i as f64 * -1.13);
        check(|i| i as i8);
        check(|i| i as u8);
        check(|i| i.wrapping_mul(40_503));
        check(|i| i as i64 * 1_000_003);
    }

    /// Byte buffers of up to [`NARROW_MAX`] bytes take the narrow loop:
    /// the same bits as the typed loops, every op and dtype, aligned or not.
    #[test]
    fn narrow_buffers_reduce_as_the_wide_loops_do() {
        fn check<T: Arith + PartialEq + std::fmt::Debug + Element>(from: impl Fn(i32) -> T) {
            let size = std::mem::size_of::<T>();
            for len in 0..=NARROW_MAX / size {
                let a: Vec<T> = (0..len as i32).map(|i| from(i * 7 - 30)).collect();
                let b: Vec<T> = (0..len as i32).map(|i| from(25 - i * 3)).collect();
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg] {
                    let mut want = a.clone();
                    reduce_loop(op, &mut want, &b);
                    for shift in [0, 1] {
                        let mut raw = vec![0u8; len * size + shift];
                        raw[shift..].copy_from_slice(bytemuck::cast_slice(&a));
                        reduce_bytes(T::DTYPE, op, &mut raw[shift..], bytemuck::cast_slice(&b));
                        let got: Vec<T> = raw[shift..].chunks(size).map(bytemuck::pod_read_unaligned).collect();
                        assert_eq!(got, want, "{:?} {op:?} len {len} shift {shift}", T::DTYPE);
                    }
                }
            }
        }
        check(|i| i as f32 * 0.37);
        check(|i| i as f64 * -1.13);
        check(|i| i as i8);
        check(|i| i as u8);
        check(|i| i.wrapping_mul(40_503));
        check(|i| i as i64 * 1_000_003);
    }

    #[test]
    fn avg_truncates_integers() {
        let mut v = [7i64, -7];
        finish_avg(DType::I64, bytemuck::cast_slice_mut(&mut v), 2);
        assert_eq!(v, [3, -3]);
    }
}
