//! The nouns every layer shares: ranks, element types, reduce operations,
//! collective kinds and the fingerprint that identifies one call.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A process's index in the job, `0..world_size`.
pub type Rank = usize;

/// Element type of a buffer.
///
/// ```
/// use ringleader_core::DType;
/// assert_eq!(DType::BF16.size(), 2);
/// assert_eq!(DType::parse("float32"), Some(DType::F32));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of a binary32).
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every dtype, in wire-code order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// Short lowercase name (`f32`, `bf16`, ...), as in messages and dumps.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// PyTorch's name for the type (`Float`, `BFloat16`, ...), used in dumps
    /// whose fields follow PyTorch's flight recorder.
    pub const fn torch_name(self) -> &'static str {
        match self {
            DType::F32 => "Float",
            DType::F64 => "Double",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::I8 => "Char",
            DType::U8 => "Byte",
            DType::I32 => "Int",
            DType::I64 => "Long",
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Stable one-byte code used on the wire and in the C ABI.
    pub const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            DType::I8 => 4,
            DType::U8 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
        }
    }

    /// Inverse of [`DType::code`].
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    /// Parses the names people type: `f32`, `float32`, `float`, `bf16`, `int64`, ...
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i8" | "int8" | "char" => DType::I8,
            "u8" | "uint8" | "byte" => DType::U8,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How values from different ranks are combined.
///
/// ```
/// use ringleader_core::ReduceOp;
/// assert_eq!(ReduceOp::parse("avg"), Some(ReduceOp::Avg));
/// assert_eq!(ReduceOp::Max.name(), "max");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    /// Sum; integers wrap on overflow, as numpy's do.
    Sum,
    /// Product; integers wrap on overflow.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the world size (integers: truncating division).
    Avg,
}

impl ReduceOp {
    /// Every reduce op, in wire-code order.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// Lowercase name, as in messages and the Python API.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Stable one-byte code used on the wire and in the C ABI.
    pub const fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
        }
    }

    /// Inverse of [`ReduceOp::code`].
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(code as usize).copied()
    }

    /// Parses `sum`, `prod`, `product`, `min`, `max`, `avg`, `mean` (any case).
    pub fn parse(s: &str) -> Option<ReduceOp> {
        Some(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" | "product" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" | "mean" => ReduceOp::Avg,
            _ => return None,
        })
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of a collective or point-to-point operation.
///
/// ```
/// use ringleader_core::OpKind;
/// assert_eq!(OpKind::AllReduce.name(), "all_reduce");
/// assert!(OpKind::Send.is_p2p());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Every rank ends with the reduction of every rank's buffer.
    AllReduce,
    /// Every rank ends with every rank's input, concatenated in rank order.
    AllGather,
    /// Rank r ends with segment r of the reduction.
    ReduceScatter,
    /// Every rank ends with the root's buffer.
    Broadcast,
    /// The root ends with the reduction.
    Reduce,
    /// No rank leaves before every rank has entered.
    Barrier,
    /// Rank r sends segment j of its input to rank j.
    AllToAll,
    /// Point-to-point send.
    Send,
    /// Point-to-point receive.
    Recv,
    /// A barrier whose rank 0 names the ranks that did not arrive in time.
    MonitoredBarrier,
}

impl OpKind {
    /// Every op kind, in wire-code order.
    pub const ALL: [OpKind; 10] = [
        OpKind::AllReduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::Barrier,
        OpKind::AllToAll,
        OpKind::Send,
        OpKind::Recv,
        OpKind::MonitoredBarrier,
    ];

    /// The name used in messages, dumps and the CLI (`all_reduce`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::Barrier => "barrier",
            OpKind::AllToAll => "all_to_all",
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::MonitoredBarrier => "monitored_barrier",
        }
    }

    /// Stable one-byte code used on the wire and in the C ABI.
    pub const fn code(self) -> u8 {
        match self {
            OpKind::AllReduce => 0,
            OpKind::AllGather => 1,
            OpKind::ReduceScatter => 2,
            OpKind::Broadcast => 3,
            OpKind::Reduce => 4,
            OpKind::Barrier => 5,
            OpKind::AllToAll => 6,
            OpKind::Send => 7,
            OpKind::Recv => 8,
            OpKind::MonitoredBarrier => 9,
        }
    }

    /// Inverse of [`OpKind::code`].
    pub fn from_code(code: u8) -> Option<OpKind> {
        OpKind::ALL.get(code as usize).copied()
    }

    /// Parses the names of [`OpKind::name`].
    pub fn parse(s: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Send and receive are numbered per peer pair, not per communicator.
    pub const fn is_p2p(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Recv)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What must agree between ranks for one collective call to be correct.
///
/// The fingerprint travels in the header of every data frame, so checking
/// that peers agree costs no extra message.
///
/// ```
/// use ringleader_core::{DType, Fingerprint, OpKind, ReduceOp};
/// let fp = Fingerprint::new(OpKind::AllReduce, DType::F32, 1000).with_reduce_op(ReduceOp::Sum);
/// assert_eq!(fp.to_string(), "all_reduce(f32 x 1000, sum)");
/// assert_eq!(Fingerprint::decode(&fp.encode()), Some(fp));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The operation.
    pub op: OpKind,
    /// Element type.
    pub dtype: DType,
    /// Elements in this rank's input (per rank for all_gather and the p2p ops).
    pub count: u64,
    /// Root rank (broadcast, reduce) or peer (send, recv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<u32>,
    /// Reduce op, for the reducing collectives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_op: Option<ReduceOp>,
}

impl Fingerprint {
    /// Size of [`Fingerprint::encode`]'s output.
    pub const ENCODED_LEN: usize = 16;
    const NONE_U8: u8 = 0xff;
    const NONE_U32: u32 = u32::MAX;

    /// A fingerprint without root or reduce op.
    pub fn new(op: OpKind, dtype: DType, count: u64) -> Fingerprint {
        Fingerprint { op, dtype, count, root: None, reduce_op: None }
    }

    /// Sets the root (or the peer, for send and recv).
    pub fn with_root(mut self, root: Rank) -> Fingerprint {
        self.root = Some(root as u32);
        self
    }

    /// Sets the reduce op.
    pub fn with_reduce_op(mut self, op: ReduceOp) -> Fingerprint {
        self.reduce_op = Some(op);
        self
    }

    /// Payload bytes of this rank's input.
    pub fn bytes(&self) -> u64 {
        self.count.saturating_mul(self.dtype.size() as u64)
    }

    /// Fixed 16-byte encoding: op, dtype, reduce op, 0, root (LE u32), count (LE u64).
    #[inline]
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0] = self.op.code();
        b[1] = self.dtype.code();
        b[2] = self.reduce_op.map_or(Self::NONE_U8, ReduceOp::code);
        b[4..8].copy_from_slice(&self.root.unwrap_or(Self::NONE_U32).to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    /// [`Fingerprint::encode`] as two little-endian words, computed
    /// directly: what the shared-memory fastboxes, the flight recorder and
    /// the running collective store, once per call each.
    #[inline]
    pub fn words(&self) -> [u64; 2] {
        let reduce = self.reduce_op.map_or(Self::NONE_U8, ReduceOp::code);
        let root = self.root.unwrap_or(Self::NONE_U32);
        let first = u64::from(self.op.code())
            | u64::from(self.dtype.code()) << 8
            | u64::from(reduce) << 16
            | u64::from(root) << 32;
        [first, self.count]
    }

    /// Decodes [`Fingerprint::encode`]'s output; `None` for unknown codes.
    pub fn decode(b: &[u8]) -> Option<Fingerprint> {
        if b.len() < Self::ENCODED_LEN {
            return None;
        }
        let op = OpKind::from_code(b[0])?;
        let dtype = DType::from_code(b[1])?;
        let reduce_op = match b[2] {
            Self::NONE_U8 => None,
            c => Some(ReduceOp::from_code(c)?),
        };
        let root = u32::from_le_bytes(b[4..8].try_into().ok()?);
        let count = u64::from_le_bytes(b[8..16].try_into().ok()?);
        Some(Fingerprint { op, dtype, count, root: (root != Self::NONE_U32).then_some(root), reduce_op })
    }

    /// Whether a peer holding `other` takes part in the same call as us.
    ///
    /// Equal fingerprints match, and a send matches the receive that names
    /// the sender (each side names the other as `root`, so roots differ).
    pub fn matches(&self, other: &Fingerprint) -> bool {
        match (self.op, other.op) {
            (OpKind::Send, OpKind::Recv) | (OpKind::Recv, OpKind::Send) => {
                self.dtype == other.dtype && self.count == other.count
            }
            _ => self == other,
        }
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({} x {}", self.op, self.dtype, self.count)?;
        if let Some(root) = self.root {
            let what = if self.op.is_p2p() { "peer" } else { "root" };
            write!(f, ", {what} {root}")?;
        }
        if let Some(op) = self.reduce_op {
            write!(f, ", {op}")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        for r in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_code(r.code()), Some(r));
            assert_eq!(ReduceOp::parse(r.name()), Some(r));
        }
        for o in OpKind::ALL {
            assert_eq!(OpKind::from_code(o.code()), Some(o));
            assert_eq!(OpKind::parse(o.name()), Some(o));
        }
    }

    #[test]
    fn fingerprint_words_are_its_encoding_read_as_two_little_endian_words() {
        let fps = [
            Fingerprint::new(OpKind::Broadcast, DType::BF16, 7).with_root(3),
            Fingerprint::new(OpKind::AllReduce, DType::F64, u64::MAX - 5).with_reduce_op(ReduceOp::Max),
            Fingerprint::new(OpKind::Reduce, DType::I8, 1 << 40)
                .with_root(u32::MAX as usize - 2)
                .with_reduce_op(ReduceOp::Avg),
            Fingerprint::new(OpKind::Barrier, DType::U8, 0),
        ];
        for fp in fps {
            let b = fp.encode();
            let le = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
            assert_eq!(fp.words(), [le(0), le(1)], "{fp:?}");
        }
    }

    #[test]
    fn fingerprint_round_trip_and_display() {
        let fp = Fingerprint::new(OpKind::Broadcast, DType::BF16, 7).with_root(3);
        assert_eq!(Fingerprint::decode(&fp.encode()), Some(fp));
        assert_eq!(fp.to_string(), "broadcast(bf16 x 7, root 3)");
        assert_eq!(Fingerprint::decode(&[0xee; 16]), None);
        assert_eq!(Fingerprint::decode(&[0; 3]), None);
    }

    #[test]
    fn send_matches_recv() {
        let s = Fingerprint::new(OpKind::Send, DType::F32, 4).with_root(1);
        let r = Fingerprint::new(OpKind::Recv, DType::F32, 4).with_root(0);
        assert!(s.matches(&r));
        let r5 = Fingerprint::new(OpKind::Recv, DType::F32, 5).with_root(0);
        assert!(!s.matches(&r5));
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..32)) {
            let _ = Fingerprint::decode(&bytes);
        }
    }
}
