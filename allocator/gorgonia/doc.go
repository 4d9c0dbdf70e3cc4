// Package gorgonia is a gorgonia.org/tensor Engine whose memory comes from
// a vmmalloc Allocator, so that Gorgonia (gorgonia.org/gorgonia) programs
// compute on memory vmmalloc manages. It is its own Go module, so that the
// main module does not depend on gorgonia and gonum.
//
// # Allocation
//
// Engine embeds tensor.StdEng for its kernels and implements
// tensor.NonStdEngine: without that marker, tensor.Dense would take
// StdEng's own Go-heap allocation path. Every tensor made with
// tensor.WithEngine(e), and every result the standard kernels make by
// cloning such a tensor, is allocated by Engine.Alloc with
// Allocator.Malloc on the engine's stream. Tensors never call
// Engine.Free, so the engine records its allocations: Scope opens a scope
// and Scope.Release frees, at once, everything allocated since (a
// training step's temporaries, a whole run), as Gorgonia's CUDA engine
// resets its arena; Engine.Free frees one tensor early. Released memory
// goes back to the allocator's cache, so a steady training loop makes no
// driver call per step. tensor.New cannot return an error: when Alloc
// fails (an *allocator.OutOfMemoryError) it panics with it.
//
// What gorgonia v0.9.18 still puts on the Go heap, whatever the engine:
// the outputs of BLAS operations (A × B and transposes), which the
// TapeMachine preallocates without an engine; tensor.StdEng.Repeat's
// results (the broadcast in Mean's gradient); views of scalar values
// (Reshape of a scalar gradient); and the comparison operators' results,
// made on StdEng. In-place operations on those stay there. The training
// test lists them and checks that every other tensor lies in a vmmalloc
// mapping.
//
// A scope must outlive every tensor the program keeps from it. gorgonia's
// AdamSolver replaces its moment tensors each step with ones allocated in
// that step and reads them in the next, so a per-step scope would free
// them too early; its Momentum and Vanilla solvers keep their state from
// the first step. Release a step's scope after the next step, or open the
// scope after the state exists, accordingly.
//
// # Host-accessible and device-only memory
//
// With Options.HostAccessible (the emulator with real memory, the CUDA
// and ACL test doubles once access is set, unified memory) the host reads
// and writes device memory at its device address: tensors are natively
// accessible, every tensor.StdEng kernel runs on them, and Memset, Memclr
// and Memcpy are StdEng's. Without it (a real GPU), AllocAccessible and
// WorksWith are false, tensors are marked natively inaccessible, and:
//
//   - allocation, Free, Scope and Release work as above;
//   - Memset (any fixed-size number), Memclr and Memcpy (device to
//     device) go through the driver's backend.Copier on the engine's
//     stream, and CopyToDevice / CopyToHost move bytes in and out;
//   - Accessible returns ErrNotAccessible, and the standard kernels
//     (arithmetic, MatMul, reductions, Data) refuse the tensors with an
//     error: computing on them needs device kernels, which this engine
//     does not have.
//
// # Streams
//
// An Engine allocates on one stream; stream-ordered reuse makes memory
// freed by Release safe for later work on that stream. A goroutine that
// queues work on another stream uses its own Engine over the same
// Allocator.
package gorgonia
