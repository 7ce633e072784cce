// The torch backend's blocking lane in C++: `ringleader._torch_native`.
//
// Why this exists: a Python subclass of torch's `Backend` costs about 10 us
// per call before it does anything (torch's trampoline takes the GIL, looks
// the method up, converts the tensors and options to Python objects and
// wraps the returned Python Work in a C++ one whose wait() takes the GIL
// again). An 8-byte collective costs well under 1 us on shared memory, so
// that trampoline was most of `dist.all_reduce`'s time.
//
// Sends and receives of one dense contiguous CPU tensor take the lane too,
// whatever torch does with the work afterwards (torch gives the backend no
// asyncOp for them: `dist.send` waits at once, `dist.isend` later): the C
// ABI moves what it can before it returns (a small send then usually has
// completed) and queues the rest; a completed one returns done work, a
// queued one `QueuedWork` over the C ABI's work handle.
//
// What it does: `FastBackend` is the C++ base class of the Python
// `RingleaderBackend` (ffi/python/ringleader/torch.py) when this module is
// built. torch calls its virtual methods; for a call torch waits for at once
// (`opts.asyncOp` false) on dense contiguous CPU tensors of a dtype and op
// ringleader serves, it calls ringleader's C ABI right here, in the calling
// thread, and returns completed work. Everything else (asynchronous calls,
// DDP's buckets, lists of tensors, CUDA tensors, odd dtypes or ops) goes
// through torch's own trampoline (`c10d::PyBackend`) to the Python methods,
// which stay the one general implementation and the one place errors are
// worded. The Python backend binds the communicator's handle and the entry
// points after it has joined, and unbinds them before the communicator is
// destroyed; while unbound every call takes the Python path.
//
// Call sites and errors keep their Python behaviour: before each call the
// lane runs the package's call-site capture (`_callsite.note`, which finds
// the user's frame) under the GIL, and on a failure it calls the package's
// converter, which raises the verdict as PyTorch's exception type; pybind11
// carries that exception back to the caller of `dist.all_reduce`.
//
// Built at install time by ffi/python/setup.py against the torch in the
// build environment (an optional extension: without a compiler the package
// installs without it and the backend runs in Python alone).

#include <torch/csrc/distributed/c10d/py/PyBackend.hpp>

#include <atomic>
#include <cstdint>

#include "ringleader.h"

namespace py = pybind11;

namespace {

// Completed work for a call that already ran in the calling thread.
class DoneWork : public c10d::Work {
 public:
  DoneWork(c10d::OpType type, std::vector<at::Tensor> result)
      : c10d::Work(-1, type), result_(std::move(result)) {
    finish();
  }

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(result_));
    return f;
  }

 private:
  std::vector<at::Tensor> result_;
};

// ringleader's dtype code for a torch dtype, -1 where the lane does not
// serve it (bool reduces only with min and max, which the Python path
// checks and names).
int dtype_code(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return RL_DTYPE_F32;
    case c10::ScalarType::Double: return RL_DTYPE_F64;
    case c10::ScalarType::Half: return RL_DTYPE_F16;
    case c10::ScalarType::BFloat16: return RL_DTYPE_BF16;
    case c10::ScalarType::Char: return RL_DTYPE_I8;
    case c10::ScalarType::Byte: return RL_DTYPE_U8;
    case c10::ScalarType::Int: return RL_DTYPE_I32;
    case c10::ScalarType::Long: return RL_DTYPE_I64;
    default: return -1;
  }
}

// ringleader's reduce-op code, -1 for the ops it does not have (PREMUL_SUM,
// the bitwise ones: the Python path names them in its error).
int op_code(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return RL_REDUCE_OP_SUM;
    case c10d::ReduceOp::PRODUCT: return RL_REDUCE_OP_PROD;
    case c10d::ReduceOp::MIN: return RL_REDUCE_OP_MIN;
    case c10d::ReduceOp::MAX: return RL_REDUCE_OP_MAX;
    case c10d::ReduceOp::AVG: return RL_REDUCE_OP_AVG;
    default: return -1;
  }
}

// A tensor the lane can hand to the C ABI as it is: a dense, contiguous CPU
// tensor of a served dtype; its code, else -1.
int lane_code(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided ||
      !t.is_contiguous()) {
    return -1;
  }
  return dtype_code(t.scalar_type());
}

// The C ABI's entry points the lane calls, as the package's loaded library
// resolved them (addresses handed over from ctypes).
struct Entry {
  decltype(&rl_all_reduce) all_reduce = nullptr;
  decltype(&rl_all_gather) all_gather = nullptr;
  decltype(&rl_reduce_scatter) reduce_scatter = nullptr;
  decltype(&rl_broadcast) broadcast = nullptr;
  decltype(&rl_barrier) barrier = nullptr;
  decltype(&rl_send) send = nullptr;
  decltype(&rl_recv) recv = nullptr;
  decltype(&rl_work_wait) work_wait = nullptr;
  decltype(&rl_work_test) work_test = nullptr;
  decltype(&rl_work_free) work_free = nullptr;
};

class FastBackend;

// Work over a send or receive the C ABI queued (`rl_work`): waits through
// the handle, raises its failure as the package does, frees it when torch
// lets the work go (the C ABI waits there for a call still running, which
// writes into the tensor this work keeps alive until then).
class QueuedWork : public c10d::Work {
 public:
  QueuedWork(c10::intrusive_ptr<FastBackend> backend, c10d::OpType type,
             std::vector<at::Tensor> tensors, rl_work* work);
  ~QueuedWork() override;
  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return tensors_; }
  // Completed once the call has ended: waits for it first (a send or
  // receive is rarely chained through futures; its wait is bounded by the
  // communicator's timeout).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  c10::intrusive_ptr<FastBackend> backend_;
  std::vector<at::Tensor> tensors_;
  rl_work* work_;
};

// torch's trampoline (c10d::PyBackend) looks a Python subclass's methods up
// under Backend's pybind11 type; a subclass of FastBackend is registered
// under FastBackend's, so that lookup finds nothing. Every method the
// Python class defines is therefore looked up here, under this class.
#define RL_PYTHON_WORK(pyname, fallback, ...)                                   \
  do {                                                                          \
    py::gil_scoped_acquire gil_;                                                \
    py::function o_ = py::get_override(static_cast<const FastBackend*>(this), pyname); \
    if (o_) {                                                                   \
      py::object r_ = o_(__VA_ARGS__);                                          \
      if (r_.is_none()) {                                                       \
        return c10::intrusive_ptr<c10d::Work>();                                \
      }                                                                         \
      return c10::make_intrusive<c10d::PyProcessGroup::PyWorkHolder>(std::move(r_)); \
    }                                                                           \
  } while (0);                                                                  \
  return c10d::Backend::fallback(__VA_ARGS__)

#define RL_PYTHON_VOID(pyname, fallback, ...)                                   \
  do {                                                                          \
    py::gil_scoped_acquire gil_;                                                \
    py::function o_ = py::get_override(static_cast<const FastBackend*>(this), pyname); \
    if (o_) {                                                                   \
      o_(__VA_ARGS__);                                                          \
      return;                                                                   \
    }                                                                           \
  } while (0);                                                                  \
  return c10d::Backend::fallback(__VA_ARGS__)

using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

class FastBackend : public c10d::PyBackend {
 public:
  using c10d::PyBackend::PyBackend;

  ~FastBackend() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      note_ = py::object();
      raise_ = py::object();
    } else {  // the interpreter is gone: leak the references, never touch it
      note_.release();
      raise_.release();
    }
  }

  // Called by the Python backend once its communicator exists (the GIL is
  // held). `note` is the call-site capture or None; `raise_code` raises the
  // failure of a call that returned `rc` as torch's exception type.
  void bind(std::uintptr_t comm, std::uintptr_t all_reduce,
            std::uintptr_t all_gather, std::uintptr_t reduce_scatter,
            std::uintptr_t broadcast, std::uintptr_t barrier, std::uintptr_t send,
            std::uintptr_t recv, std::uintptr_t work_wait, std::uintptr_t work_test,
            std::uintptr_t work_free, py::object note, py::object raise_code) {
    if (comm == 0 || !all_reduce || !all_gather || !reduce_scatter ||
        !broadcast || !barrier || !send || !recv || !work_wait || !work_test ||
        !work_free) {
      throw py::value_error("FastBackend.bind: a null handle or entry point");
    }
    entry_.send = reinterpret_cast<decltype(entry_.send)>(send);
    entry_.recv = reinterpret_cast<decltype(entry_.recv)>(recv);
    entry_.work_wait = reinterpret_cast<decltype(entry_.work_wait)>(work_wait);
    entry_.work_test = reinterpret_cast<decltype(entry_.work_test)>(work_test);
    entry_.work_free = reinterpret_cast<decltype(entry_.work_free)>(work_free);
    entry_.all_reduce = reinterpret_cast<decltype(entry_.all_reduce)>(all_reduce);
    entry_.all_gather = reinterpret_cast<decltype(entry_.all_gather)>(all_gather);
    entry_.reduce_scatter =
        reinterpret_cast<decltype(entry_.reduce_scatter)>(reduce_scatter);
    entry_.broadcast = reinterpret_cast<decltype(entry_.broadcast)>(broadcast);
    entry_.barrier = reinterpret_cast<decltype(entry_.barrier)>(barrier);
    note_ = note.is_none() ? py::object() : std::move(note);
    raise_ = std::move(raise_code);
    comm_.store(reinterpret_cast<const rl_comm*>(comm), std::memory_order_release);
  }

  // Before the communicator is destroyed: later calls take the Python path
  // (which reports the destroyed group).
  void unbind() { comm_.store(nullptr, std::memory_order_release); }

  bool bound() const { return comm_.load(std::memory_order_acquire) != nullptr; }

  // -- the lane: blocking calls on dense CPU tensors -------------------------

  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    const rl_comm* comm = lane(opts.asyncOp);
    if (comm != nullptr && tensors.size() == 1) {
      int code = lane_code(tensors[0]);
      int op = op_code(opts.reduceOp);
      if (code >= 0 && op >= 0) {
        note();
        at::Tensor& t = tensors[0];
        check(entry_.all_reduce(comm, t.data_ptr(), t.numel(), code, op, nullptr));
        return c10::make_intrusive<DoneWork>(c10d::OpType::ALLREDUCE, tensors);
      }
    }
    RL_PYTHON_WORK("allreduce", allreduce, tensors, opts);
  }

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    const rl_comm* comm = lane(opts.asyncOp);
    if (comm != nullptr && tensors.size() == 1 && opts.rootTensor == 0) {
      int code = lane_code(tensors[0]);
      if (code >= 0) {
        note();
        at::Tensor& t = tensors[0];
        check(entry_.broadcast(comm, t.data_ptr(), t.numel(), code, opts.rootRank, nullptr));
        return c10::make_intrusive<DoneWork>(c10d::OpType::BROADCAST, tensors);
      }
    }
    RL_PYTHON_WORK("broadcast", broadcast, tensors, opts);
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override {
    if (WorkPtr w = gather_lane(output, input, opts)) {
      return w;
    }
    RL_PYTHON_WORK("_allgather_base", _allgather_base, output, input, opts);
  }

  WorkPtr all_gather_single(at::Tensor& output, at::Tensor& input,
                            const c10d::AllgatherOptions& opts) override {
    if (WorkPtr w = gather_lane(output, input, opts)) {
      return w;
    }
    RL_PYTHON_WORK("all_gather_single", all_gather_single, output, input, opts);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    if (WorkPtr w = scatter_lane(output, input, opts)) {
      return w;
    }
    RL_PYTHON_WORK("_reduce_scatter_base", _reduce_scatter_base, output, input, opts);
  }

  WorkPtr reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                const c10d::ReduceScatterOptions& opts) override {
    if (WorkPtr w = scatter_lane(output, input, opts)) {
      return w;
    }
    RL_PYTHON_WORK("reduce_scatter_single", reduce_scatter_single, output, input, opts);
  }

  WorkPtr barrier(const c10d::BarrierOptions& opts) override {
    const rl_comm* comm = lane(opts.asyncOp);
    if (comm != nullptr) {
      note();
      check(entry_.barrier(comm, nullptr));
      return c10::make_intrusive<DoneWork>(c10d::OpType::BARRIER, Tensors{});
    }
    RL_PYTHON_WORK("barrier", barrier, opts);
  }

  // -- everything else: the Python class's methods ---------------------------

  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override {
    RL_PYTHON_WORK("allreduce_coalesced", allreduce_coalesced, tensors, opts);
  }

  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    RL_PYTHON_WORK("reduce", reduce, tensors, opts);
  }

  WorkPtr allgather(TensorLists& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions& opts) override {
    RL_PYTHON_WORK("allgather", allgather, outputs, inputs, opts);
  }

  WorkPtr allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override {
    RL_PYTHON_WORK("allgather_coalesced", allgather_coalesced, outputs, inputs, opts);
  }

  WorkPtr all_gather_single_coalesced(Tensors& outputs, Tensors& inputs,
                                      const c10d::AllgatherOptions& opts) override {
    RL_PYTHON_WORK("all_gather_single_coalesced", all_gather_single_coalesced, outputs,
                   inputs, opts);
  }

  WorkPtr gather(TensorLists& outputs, Tensors& inputs,
                 const c10d::GatherOptions& opts) override {
    RL_PYTHON_WORK("gather", gather, outputs, inputs, opts);
  }

  WorkPtr scatter(Tensors& outputs, TensorLists& inputs,
                  const c10d::ScatterOptions& opts) override {
    RL_PYTHON_WORK("scatter", scatter, outputs, inputs, opts);
  }

  WorkPtr reduce_scatter(Tensors& outputs, TensorLists& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    RL_PYTHON_WORK("reduce_scatter", reduce_scatter, outputs, inputs, opts);
  }

  WorkPtr reduce_scatter_single_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    RL_PYTHON_WORK("reduce_scatter_single_coalesced", reduce_scatter_single_coalesced,
                   outputs, inputs, opts);
  }

  WorkPtr alltoall(Tensors& outputs, Tensors& inputs,
                   const c10d::AllToAllOptions& opts) override {
    RL_PYTHON_WORK("alltoall", alltoall, outputs, inputs, opts);
  }

  WorkPtr all_to_all_single(at::Tensor& output, at::Tensor& input,
                            std::vector<int64_t>& output_splits,
                            std::vector<int64_t>& input_splits,
                            const c10d::AllToAllOptions& opts) override {
    RL_PYTHON_WORK("all_to_all_single", all_to_all_single, output, input, output_splits,
                   input_splits, opts);
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input,
                        std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits,
                        const c10d::AllToAllOptions& opts) override {
    RL_PYTHON_WORK("alltoall_base", alltoall_base, output, input, output_splits,
                   input_splits, opts);
  }

  WorkPtr send(Tensors& tensors, int dst, int tag) override {
    if (WorkPtr w = p2p_lane(tensors, dst, true)) {
      return w;
    }
    RL_PYTHON_WORK("send", send, tensors, dst, tag);
  }

  WorkPtr recv(Tensors& tensors, int src, int tag) override {
    if (WorkPtr w = p2p_lane(tensors, src, false)) {
      return w;
    }
    RL_PYTHON_WORK("recv", recv, tensors, src, tag);
  }

  // The C ABI's wait, test and free of a work handle (bound: a QueuedWork
  // exists only once bind has run, and the entry points never change).
  const Entry& entry() const { return entry_; }

  // A failed call raises the package's exception (see `check`).
  void fail(int rc) { check(rc); }

  WorkPtr recvAnysource(Tensors& tensors, int tag) override {
    RL_PYTHON_WORK("recv_anysource", recvAnysource, tensors, tag);
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    RL_PYTHON_VOID("monitored_barrier", monitoredBarrier, opts, wait_all_ranks);
  }

  void abort() override { RL_PYTHON_VOID("abort", abort); }

  void shutdown() override { RL_PYTHON_VOID("shutdown", shutdown); }

  const std::string getBackendName() const override {
    py::gil_scoped_acquire gil;
    py::function o = py::get_override(static_cast<const FastBackend*>(this), "getBackendName");
    if (o) {
      return o().cast<std::string>();
    }
    return "ringleader";
  }

  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    py::gil_scoped_acquire gil;
    py::function o = py::get_override(static_cast<const FastBackend*>(this), "split");
    if (!o) {
      return c10d::Backend::split(store, ranks, opts);
    }
    py::object child = o(store, ranks, opts);
    if (child.is_none()) {  // this rank is not in the new group
      return {};
    }
    return child.cast<c10::intrusive_ptr<c10d::Backend>>();
  }

 private:
  // The communicator when this call may take the lane: blocking, and bound.
  const rl_comm* lane(bool async_op) const {
    if (async_op) {
      return nullptr;
    }
    return comm_.load(std::memory_order_acquire);
  }

  WorkPtr gather_lane(at::Tensor& output, at::Tensor& input,
                      const c10d::AllgatherOptions& opts) {
    const rl_comm* comm = lane(opts.asyncOp);
    if (comm == nullptr) {
      return {};
    }
    int code = lane_code(output);
    if (code < 0 || lane_code(input) != code) {
      return {};
    }
    note();
    check(entry_.all_gather(comm, input.data_ptr(), input.numel(), output.data_ptr(),
                            output.numel(), code, nullptr));
    return c10::make_intrusive<DoneWork>(c10d::OpType::_ALLGATHER_BASE, Tensors{output});
  }

  // A send (or receive) of one dense contiguous CPU tensor through the C
  // ABI: done work when it completed before the call returned, else work
  // over its queued handle; null where the Python path serves it.
  WorkPtr p2p_lane(Tensors& tensors, int peer, bool send) {
    const rl_comm* comm = comm_.load(std::memory_order_acquire);
    if (comm == nullptr || tensors.size() != 1) {
      return {};
    }
    at::Tensor& t = tensors[0];
    int code = lane_code(t);
    if (code < 0) {
      return {};
    }
    note();
    rl_work* work = nullptr;
    int rc = send ? entry_.send(comm, t.data_ptr(), t.numel(), code, peer, &work)
                  : entry_.recv(comm, t.data_ptr(), t.numel(), code, peer, &work);
    check(rc);
    c10d::OpType type = send ? c10d::OpType::SEND : c10d::OpType::RECV;
    bool done = false;
    if (entry_.work_test(work, &done) == RL_OK && done) {
      rc = entry_.work_wait(work, -1.0);
      entry_.work_free(work);
      check(rc);
      return c10::make_intrusive<DoneWork>(type, tensors);
    }
    return c10::make_intrusive<QueuedWork>(
        c10::intrusive_ptr<FastBackend>::reclaim_copy(this), type, tensors, work);
  }

  WorkPtr scatter_lane(at::Tensor& output, at::Tensor& input,
                       const c10d::ReduceScatterOptions& opts) {
    const rl_comm* comm = lane(opts.asyncOp);
    if (comm == nullptr) {
      return {};
    }
    int code = lane_code(output);
    int op = op_code(opts.reduceOp);
    if (code < 0 || op < 0 || lane_code(input) != code) {
      return {};
    }
    note();
    check(entry_.reduce_scatter(comm, input.data_ptr(), input.numel(), output.data_ptr(),
                                output.numel(), code, op, nullptr));
    return c10::make_intrusive<DoneWork>(c10d::OpType::_REDUCE_SCATTER_BASE, Tensors{output});
  }

  // The user's call site, as the Python path records it. A failure to
  // record one never fails the call.
  void note() {
    if (!note_) {
      return;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject* r = PyObject_CallNoArgs(note_.ptr());
    if (r == nullptr) {
      PyErr_Clear();
    } else {
      Py_DECREF(r);
    }
    PyGILState_Release(g);
  }

  // A failed call raises the package's exception (torch's type, the verdict
  // as its message), carried to the caller as a Python error.
  void check(int rc) {
    if (rc == RL_OK) {
      return;
    }
    py::gil_scoped_acquire gil;
    raise_(rc);  // raises: pybind11 throws error_already_set
    throw std::runtime_error("ringleader: call failed with code " + std::to_string(rc));
  }

  std::atomic<const rl_comm*> comm_{nullptr};
  Entry entry_;
  py::object note_;
  py::object raise_;
};

QueuedWork::QueuedWork(c10::intrusive_ptr<FastBackend> backend, c10d::OpType type,
                       std::vector<at::Tensor> tensors, rl_work* work)
    : c10d::Work(-1, type),
      backend_(std::move(backend)),
      tensors_(std::move(tensors)),
      work_(work) {}

// Runs `f` without the GIL when this thread holds it: it may wait for a
// call that runs on.
template <typename F>
auto without_gil(F f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    return f();
  }
  return f();
}

QueuedWork::~QueuedWork() {
  // The call may still run (torch dropped the work unwaited): the C ABI
  // waits for it.
  without_gil([this] { backend_->entry().work_free(work_); });
}

bool QueuedWork::isCompleted() {
  bool done = false;
  return backend_->entry().work_test(work_, &done) == RL_OK && done;
}

bool QueuedWork::isSuccess() const {
  bool done = false;
  const Entry& e = backend_->entry();
  return e.work_test(work_, &done) == RL_OK && done && e.work_wait(work_, 0.0) == RL_OK;
}

bool QueuedWork::wait(std::chrono::milliseconds timeout) {
  double limit = timeout.count() > 0 ? timeout.count() / 1000.0 : -1.0;
  int rc = without_gil([&] { return backend_->entry().work_wait(work_, limit); });
  backend_->fail(rc);
  finish();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> QueuedWork::getFuture() {
  wait(std::chrono::milliseconds(0));
  auto f = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()));
  f->markCompleted(c10::IValue(tensors_));
  return f;
}

}  // namespace

PYBIND11_MODULE(_torch_native, m) {
  m.doc() = "The ringleader torch backend's blocking lane in C++ (see _torch_native.cpp).";
  py::module_::import("torch.distributed");  // registers c10d::Backend with pybind11
  py::class_<FastBackend, c10d::Backend, c10::intrusive_ptr<FastBackend>>(m, "FastBackend")
      .def(py::init<int, int>(), py::arg("rank"), py::arg("size"))
      .def("_fast_bind", &FastBackend::bind)
      .def("_fast_unbind", &FastBackend::unbind)
      .def_property_readonly("_fast_bound", &FastBackend::bound);
}
