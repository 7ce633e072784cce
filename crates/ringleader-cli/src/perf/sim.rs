//! An in-memory world of ranks on threads with naive collectives, to test
//! the benchmark loop and its checks without processes or sockets.
//!
//! Every collective is an exchange: each rank deposits a copy of its buffer,
//! all meet at a barrier, each computes its own result from everyone's
//! copies, and all meet again before the slots are reused.

use super::bench::{call_blocking, Call, Collectives, CommResult};
use ringleader_core::reduce::{finish_avg, reduce_slice};
use ringleader_core::{Element, ReduceOp};
use std::any::Any;
use std::sync::{Arc, Barrier, Mutex};

type Slot = Option<Box<dyn Any + Send>>;

#[derive(Debug)]
struct Shared {
    n: usize,
    slots: Mutex<Vec<Slot>>,
    barrier: Barrier,
}

/// One rank of a simulated world.
#[derive(Debug)]
pub(crate) struct SimWorld {
    rank: usize,
    shared: Arc<Shared>,
    /// Rank 1 writes a wrong value into element 0 of every result.
    corrupt: bool,
}

impl SimWorld {
    /// Runs `body` on `n` ranks, one thread each; returns each rank's result.
    pub(crate) fn run<R: Send>(n: usize, corrupt: bool, body: impl Fn(&SimWorld) -> R + Sync) -> Vec<R> {
        let shared =
            Arc::new(Shared { n, slots: Mutex::new((0..n).map(|_| None).collect()), barrier: Barrier::new(n) });
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let comm = SimWorld { rank, shared: shared.clone(), corrupt };
                    let body = &body;
                    s.spawn(move || body(&comm))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Every rank's copy of its `mine`, in rank order.
    fn exchange<T: Element>(&self, mine: &[T]) -> Vec<Vec<T>> {
        self.shared.slots.lock().unwrap()[self.rank] = Some(Box::new(mine.to_vec()));
        self.shared.barrier.wait();
        let all = self
            .shared
            .slots
            .lock()
            .unwrap()
            .iter()
            .map(|s| {
                s.as_ref().and_then(|b| b.downcast_ref::<Vec<T>>()).expect("every rank deposits the same type").clone()
            })
            .collect();
        self.shared.barrier.wait();
        all
    }

    fn reduce_all<T: Element>(all: &[Vec<T>], op: ReduceOp) -> Vec<T> {
        let step = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let mut acc = all[0].clone();
        for other in &all[1..] {
            reduce_slice(step, &mut acc, other);
        }
        if op == ReduceOp::Avg {
            finish_avg(T::DTYPE, bytemuck::cast_slice_mut(&mut acc), all.len());
        }
        acc
    }

    /// With `corrupt`, rank 1 spoils element 0 of every result longer than
    /// one element (the benchmark's own one-element all_reduces stay right).
    fn spoil<T: Element>(&self, out: &mut [T]) {
        if self.corrupt && self.rank == 1 && out.len() > 1 {
            out[0] = seventy_seven();
        }
    }
}

/// 77 in `T`: neither a pattern value nor the poison.
fn seventy_seven<T: Element>() -> T {
    use ringleader_core::DType;
    let bytes: Vec<u8> = match T::DTYPE {
        DType::F32 => 77f32.to_le_bytes().to_vec(),
        DType::F64 => 77f64.to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(77.0).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f32(77.0).to_le_bytes().to_vec(),
        DType::I8 => 77i8.to_le_bytes().to_vec(),
        DType::U8 => 77u8.to_le_bytes().to_vec(),
        DType::I32 => 77i32.to_le_bytes().to_vec(),
        DType::I64 => 77i64.to_le_bytes().to_vec(),
    };
    bytemuck::pod_read_unaligned(&bytes)
}

impl Collectives for SimWorld {
    /// Submitted collectives run at once; this is their result.
    type Pending<T: Element> = (Vec<T>, Vec<T>);

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.n
    }

    fn transport(&self) -> &str {
        "sim"
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> CommResult<()> {
        let all = self.exchange(buf);
        buf.copy_from_slice(&Self::reduce_all(&all, op));
        self.spoil(buf);
        Ok(())
    }

    fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> CommResult<()> {
        let all = self.exchange(input);
        for (j, chunk) in all.iter().enumerate() {
            output[j * input.len()..(j + 1) * input.len()].copy_from_slice(chunk);
        }
        self.spoil(output);
        Ok(())
    }

    fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T], op: ReduceOp) -> CommResult<()> {
        let all = self.exchange(input);
        let red = Self::reduce_all(&all, op);
        let per = output.len();
        output.copy_from_slice(&red[self.rank * per..(self.rank + 1) * per]);
        self.spoil(output);
        Ok(())
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> CommResult<()> {
        let all = self.exchange(buf);
        buf.copy_from_slice(&all[root]);
        self.spoil(buf);
        Ok(())
    }

    fn reduce<T: Element>(&self, buf: &mut [T], root: usize, op: ReduceOp) -> CommResult<()> {
        let all = self.exchange(buf);
        if self.rank == root {
            buf.copy_from_slice(&Self::reduce_all(&all, op));
        }
        self.spoil(buf);
        Ok(())
    }

    fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> CommResult<()> {
        let all = self.exchange(input);
        let per = input.len() / self.shared.n;
        for (j, theirs) in all.iter().enumerate() {
            output[j * per..(j + 1) * per].copy_from_slice(&theirs[self.rank * per..(self.rank + 1) * per]);
        }
        self.spoil(output);
        Ok(())
    }

    fn barrier(&self) -> CommResult<()> {
        self.shared.barrier.wait();
        Ok(())
    }

    fn submit<T: Element>(&self, call: Call, input: Vec<T>, mut output: Vec<T>) -> CommResult<(Vec<T>, Vec<T>)> {
        call_blocking(self, call, &input, &mut output)?;
        Ok((input, output))
    }

    fn complete<T: Element>(&self, pending: (Vec<T>, Vec<T>)) -> CommResult<(Vec<T>, Vec<T>)> {
        Ok(pending)
    }
}
