package gorgonia

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

// The model: a two-layer perceptron (tanh hidden layer) fitting
// y = sin(x₁+…+x₄) on 64 generated samples, trained with momentum SGD.
const (
	nSamples = 64
	nIn      = 4
	nHidden  = 16
	nSteps   = 300
)

// mlpData is the generated data set and the initial weights.
type mlpData struct{ x, y, w0, w1 []float64 }

func genData() mlpData {
	r := rand.New(rand.NewPCG(1, 2))
	var d mlpData
	for range nSamples {
		s := 0.0
		for range nIn {
			v := r.Float64()*2 - 1
			d.x = append(d.x, v)
			s += v
		}
		d.y = append(d.y, math.Sin(s))
	}
	for range nIn * nHidden {
		d.w0 = append(d.w0, (r.Float64()*2-1)/math.Sqrt(nIn))
	}
	for range nHidden {
		d.w1 = append(d.w1, (r.Float64()*2-1)/math.Sqrt(nHidden))
	}
	return d
}

// mlp is a compiled model: its graph, machine and solver.
type mlp struct {
	g       *G.ExprGraph
	vm      G.VM
	solver  G.Solver
	learn   G.Nodes
	lossVal G.Value
}

// newMLP builds the model with its tensors on eng (tensor.StdEng's Go heap
// when eng is nil).
func newMLP(t *testing.T, eng tensor.Engine) *mlp {
	t.Helper()
	d := genData()
	g := G.NewGraph()
	mk := func(name string, shape []int, data []float64) *G.Node {
		var tt *tensor.Dense
		if eng == nil {
			tt = tensor.New(tensor.WithShape(shape...), tensor.WithBacking(slices.Clone(data)))
		} else {
			tt = tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(shape...), tensor.WithEngine(eng))
			copy(tt.Data().([]float64), data)
		}
		return G.NewTensor(g, G.Float64, len(shape), G.WithShape(shape...), G.WithName(name), G.WithValue(tt))
	}
	x := mk("x", []int{nSamples, nIn}, d.x)
	y := mk("y", []int{nSamples, 1}, d.y)
	w0 := mk("w0", []int{nIn, nHidden}, d.w0)
	w1 := mk("w1", []int{nHidden, 1}, d.w1)
	h := G.Must(G.Tanh(G.Must(G.Mul(x, w0))))
	pred := G.Must(G.Mul(h, w1))
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(pred, y))))))
	_, err := G.Grad(loss, w0, w1)
	require.NoError(t, err)
	m := &mlp{g: g, learn: G.Nodes{w0, w1}, solver: G.NewMomentum(G.WithLearnRate(0.05), G.WithMomentum(0.9))}
	G.Read(loss, &m.lossVal)
	opts := []G.VMOpt{G.BindDualValues(w0, w1)}
	if eng != nil {
		opts = append(opts, G.WithEngine(eng))
	}
	m.vm = G.NewTapeMachine(g, opts...)
	return m
}

// step runs one training step and returns the loss.
func (m *mlp) step(t *testing.T) float64 {
	t.Helper()
	require.NoError(t, m.vm.RunAll())
	require.NoError(t, m.solver.Step(G.NodesToValueGrads(m.learn)))
	loss := m.lossVal.Data().(float64)
	m.vm.Reset()
	return loss
}

// tensorsOf lists every tensor value and gradient of g's nodes, by a
// name saying which.
func tensorsOf(g *G.ExprGraph) map[string]*tensor.Dense {
	out := make(map[string]*tensor.Dense)
	for _, n := range g.AllNodes() {
		if tt, ok := n.Value().(*tensor.Dense); ok {
			out[n.Name()+" value"] = tt
		}
		if gr, err := n.Grad(); err == nil {
			if tt, ok := gr.(*tensor.Dense); ok {
				out[n.Name()+" grad"] = tt
			}
		}
	}
	return out
}

// goHeapOps are the nodes whose values gorgonia v0.9.18 makes on the Go
// heap whatever the engine (and then labels with the engine): the
// TapeMachine's alloc instruction preallocates the outputs of BLAS
// operations (A × B and its transposes) with makeValue, which takes no
// engine; tensor.StdEng.Repeat builds its result with tensor.New and no
// engine; and Reshape of a scalar views the scalar's own Go memory.
var goHeapOps = []string{"A × B", "Aᵀ × B", "A × Bᵀ", "Repeat", "Reshape"}

func heapByDesign(name string) bool {
	for _, op := range goHeapOps {
		if strings.HasPrefix(name, op) {
			return true
		}
	}
	return false
}

func inRanges(rs []backend.Range, p uintptr, n uint64) bool {
	for _, r := range rs {
		if p >= r.Addr && p+uintptr(n) <= r.Addr+uintptr(r.Size) {
			return true
		}
	}
	return false
}

// allocated reports whether [p, p+n) lies in one live allocation of e.
func (e *Engine) allocated(p uintptr, n uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for q, al := range e.live {
		if p >= q && p+uintptr(n) <= q+uintptr(max(al.size, 1)) {
			return true
		}
	}
	return false
}

// driverCalls counts what the allocator asked of the driver: maps, unmaps,
// handle creations and frees, stream and event synchronisations.
func driverCalls(a *allocator.Allocator) int64 {
	s := a.Stats()
	return s.NumDeviceAlloc + s.NumDeviceFree + s.HandlesCreated + s.HandlesFreed + s.NumStreamSyncs + s.NumSyncAllStreams
}

// trainOn trains the model on drv's device 0 through an Engine and checks
// it against the run on tensor.StdEng. calls, if not nil, counts every
// driver call (the emulator's own count).
func trainOn(t *testing.T, drv backend.Driver, calls func() int64) {
	ref := newMLP(t, nil)
	var want []float64
	for range nSteps {
		want = append(want, ref.step(t))
	}
	require.Less(t, want[nSteps-1], want[0]/10, "the reference run learns")

	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	eng, err := New(a, 0, Options{HostAccessible: true})
	require.NoError(t, err)
	in := drv.(backend.Introspector)

	run := eng.Scope() // everything the run allocates
	m := newMLP(t, eng)
	got := []float64{m.step(t)} // the first step also makes the gradients' and Adam's state
	var engAllocs, mallocs, driver, total, heap []int64
	for i := 1; i < nSteps; i++ {
		before, mBefore, dBefore := eng.Stats().Allocs, a.Stats().Allocation[0].Allocated, driverCalls(a)
		var cBefore int64
		if calls != nil {
			cBefore = calls()
		}
		step := eng.Scope() // what one step allocates
		got = append(got, m.step(t))

		// Every tensor whose memory the engine allocated lies in a vmmalloc
		// mapping. The only others are gorgonia's Go-heap values
		// (goHeapOps), and values of in-place operations (and gradients)
		// that share their memory.
		_, mappings, _ := in.LiveRanges(0)
		all := tensorsOf(m.g)
		var heapRanges []backend.Range
		for name, tt := range all {
			if heapByDesign(name) && !eng.allocated(tt.Uintptr(), uint64(tt.MemSize())) {
				heapRanges = append(heapRanges, backend.Range{Addr: tt.Uintptr(), Size: uint64(tt.MemSize())})
			}
		}
		nHeap := 0
		for name, tt := range all {
			p, n := tt.Uintptr(), uint64(tt.MemSize())
			require.Same(t, eng, tt.Engine(), name)
			if eng.allocated(p, n) {
				require.True(t, inRanges(mappings, p, n), "%s at %#x (%d bytes) is in a vmmalloc mapping", name, p, n)
				continue
			}
			require.True(t, inRanges(heapRanges, p, n), "%s at %#x was not allocated by the engine", name, p)
			require.False(t, inRanges(mappings, p, n), "%s", name)
			nHeap++
		}
		heap = append(heap, int64(nHeap))

		released, err := step.Release()
		require.NoError(t, err)
		engAllocs = append(engAllocs, int64(eng.Stats().Allocs-before))
		mallocs = append(mallocs, a.Stats().Allocation[0].Allocated-mBefore)
		require.Equal(t, int(engAllocs[len(engAllocs)-1]), released, "a step's scope frees what the step allocated")
		driver = append(driver, driverCalls(a)-dBefore)
		if calls != nil {
			total = append(total, calls()-cBefore)
		}
	}
	require.Len(t, got, nSteps)
	for i := range want {
		require.Equal(t, math.Float64bits(want[i]), math.Float64bits(got[i]), "step %d: loss %v on StdEng, %v on vmmalloc", i, want[i], got[i])
	}
	assert.Equal(t, engAllocs, mallocs, "the allocator counts the engine's allocations")
	steady := func(xs []int64) []int64 { return slices.Compact(slices.Clone(xs[1:])) }
	assert.Equal(t, []int64{0}, steady(driver), "no driver call in a steady step")
	if calls != nil {
		assert.Equal(t, []int64{0}, steady(total), "no driver call of any kind in a steady step")
	}
	t.Logf("%d steps, loss %.4g → %.4g, bit-identical to tensor.StdEng; engine allocations per step %v, Go-heap tensors per step %v (gorgonia's own), allocator driver calls per step: first %d then %v",
		nSteps, got[0], got[nSteps-1], steady(engAllocs), steady(heap), driver[0], steady(driver))

	n, err := run.Release()
	require.NoError(t, err)
	assert.Positive(t, n)
	assert.Zero(t, eng.Stats().Live)
	assert.Zero(t, a.MemoryAllocated())
	require.NoError(t, a.EmptyCache())
	assert.Zero(t, a.MemoryReserved())
	_, mappings, handles := in.LiveRanges(0)
	assert.Empty(t, mappings, "the device holds nothing")
	assert.Zero(t, handles)
	require.NoError(t, a.Check())
}

// TestMLPEmulator trains over the emulator's real memory.
func TestMLPEmulator(t *testing.T) {
	drv, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(64<<20))
	require.NoError(t, err)
	defer drv.Close()
	trainOn(t, drv, func() int64 {
		var n int64
		for _, c := range drv.CallCounts() {
			n += c
		}
		return n
	})
}

// TestMLPCUDADouble trains over the CUDA binding and its C test double,
// whose device memory is host memory once access is set.
func TestMLPCUDADouble(t *testing.T) {
	path, err := cudatest.Shared()
	if err != nil {
		t.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	dbl.Reset()
	drv, err := cuda.Open(cuda.WithLibrary(path))
	require.NoError(t, err)
	defer drv.Close()
	trainOn(t, drv, nil)
}
