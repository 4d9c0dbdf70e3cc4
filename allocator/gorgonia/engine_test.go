package gorgonia

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/backend/emulated"
)

func newEngine(t *testing.T, opt Options, emu ...emulated.Option) (*Engine, *allocator.Allocator) {
	t.Helper()
	drv, err := emulated.New(append([]emulated.Option{emulated.WithRealMemory(), emulated.WithCapacity(16 << 20)}, emu...)...)
	require.NoError(t, err)
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Check())
		require.NoError(t, a.Close())
		require.NoError(t, drv.Close())
	})
	eng, err := New(a, 0, opt)
	require.NoError(t, err)
	return eng, a
}

func f64s(b []byte) []float64 {
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

// Memory that is not host-accessible: tensors are marked so, the kernels
// refuse them, and Memset, Memclr and Memcpy go through the driver.
func TestEngineNotAccessible(t *testing.T) {
	eng, a := newEngine(t, Options{})
	assert.False(t, eng.AllocAccessible())
	assert.False(t, eng.WorksWith(tensor.DataOrder(0)))
	x := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(4), tensor.WithEngine(eng))
	y := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(4), tensor.WithEngine(eng))
	assert.False(t, x.IsNativelyAccessible())
	assert.Equal(t, uint64(2), eng.Stats().Allocs)
	assert.Equal(t, uint64(1024), a.MemoryAllocated(), "two 512-byte blocks")

	host := make([]byte, 32)
	require.NoError(t, eng.Memset(x, 2.5))
	require.NoError(t, eng.CopyToHost(host, x))
	assert.Equal(t, []float64{2.5, 2.5, 2.5, 2.5}, f64s(host))
	require.NoError(t, eng.Memcpy(y, x))
	require.NoError(t, eng.CopyToHost(host, y))
	assert.Equal(t, []float64{2.5, 2.5, 2.5, 2.5}, f64s(host))
	eng.Memclr(x)
	require.NoError(t, eng.CopyToHost(host, x))
	assert.Equal(t, []float64{0, 0, 0, 0}, f64s(host))
	require.NoError(t, eng.Memset(x, 0.0), "a zero value is one driver memset")

	in := binary.LittleEndian.AppendUint64(nil, math.Float64bits(-1))
	require.NoError(t, eng.CopyToDevice(x, in))
	require.NoError(t, eng.CopyToHost(host[:8], x))
	assert.Equal(t, []float64{-1}, f64s(host[:8]))
	require.ErrorIs(t, eng.CopyToDevice(x, make([]byte, 64)), ErrInvalidSize)

	_, err := tensor.Add(x, y)
	require.Error(t, err, "the standard kernels refuse inaccessible memory")
	_, err = eng.Accessible(x)
	require.ErrorIs(t, err, ErrNotAccessible)
	require.Error(t, eng.Memset(x, "text"))
}

// Host-accessible memory: the standard engine's kernels compute on it.
func TestEngineAccessible(t *testing.T) {
	eng, _ := newEngine(t, Options{HostAccessible: true})
	x := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(2, 3), tensor.WithEngine(eng))
	require.NoError(t, eng.Memset(x, float32(1.5)))
	y := x.Clone().(*tensor.Dense)
	assert.Equal(t, uint64(2), eng.Stats().Allocs, "Clone allocates through the engine")
	sum, err := tensor.Add(x, y)
	require.NoError(t, err)
	assert.Equal(t, []float32{3, 3, 3, 3, 3, 3}, sum.Data())
	assert.Same(t, eng, sum.Engine())
	assert.Equal(t, uint64(3), eng.Stats().Allocs, "so does the result")
	m, err := eng.Accessible(x)
	require.NoError(t, err)
	assert.Equal(t, x.Uintptr(), m.Uintptr())
	eng.Memclr(y)
	assert.Equal(t, []float32{0, 0, 0, 0, 0, 0}, y.Data())
}

func TestEngineScopeAndFree(t *testing.T) {
	eng, a := newEngine(t, Options{HostAccessible: true})
	outer := eng.Scope()
	w := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(8), tensor.WithEngine(eng))
	inner := eng.Scope()
	for range 3 {
		tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(100), tensor.WithEngine(eng))
	}
	e := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(100), tensor.WithEngine(eng))
	require.NoError(t, eng.Free(e, 0), "one tensor freed early")
	require.ErrorIs(t, eng.Free(e, 0), ErrUnknownMemory)
	require.ErrorIs(t, eng.Free(Memory{ptr: w.Uintptr() + 8}, 0), ErrUnknownMemory, "an interior address")
	n, err := inner.Release()
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, Stats{Allocs: 5, Frees: 4, Live: 1, LiveBytes: 64}, eng.Stats())
	assert.Equal(t, uint64(512), a.MemoryAllocated(), "w is left")
	n, err = outer.Release()
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	n, err = outer.Release()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing twice")
	assert.Zero(t, a.MemoryAllocated())

	_, err = eng.Alloc(-1)
	require.ErrorIs(t, err, ErrInvalidSize)
	z, err := eng.Alloc(0)
	require.NoError(t, err, "an empty tensor still gets an address")
	require.NoError(t, eng.Free(z, 0))
	_, err = New(nil, 0, Options{})
	require.ErrorIs(t, err, allocator.ErrInvalidConfig)
}

// Out of device memory: Alloc returns the allocator's OutOfMemoryError;
// tensor.New, which cannot return an error, panics with it.
func TestEngineOutOfMemory(t *testing.T) {
	eng, _ := newEngine(t, Options{HostAccessible: true})
	big, err := eng.Alloc(10 << 20)
	require.NoError(t, err)
	_, err = eng.Alloc(10 << 20)
	require.ErrorIs(t, err, allocator.ErrOutOfMemory)
	var got any
	func() {
		defer func() { got = recover() }()
		tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(10<<17), tensor.WithEngine(eng))
	}()
	perr, ok := got.(error)
	require.True(t, ok, "tensor.New panics with the error: %v", got)
	require.ErrorIs(t, perr, allocator.ErrOutOfMemory)
	require.NoError(t, eng.Free(big, 0))
	assert.Zero(t, eng.Stats().Live)
}

// Calls over a closed allocator fail with ErrClosed.
func TestEngineClosed(t *testing.T) {
	drv, err := emulated.New(emulated.WithRealMemory(), emulated.WithCapacity(16<<20))
	require.NoError(t, err)
	defer drv.Close()
	a, err := allocator.New(drv, allocator.DefaultConfig())
	require.NoError(t, err)
	eng, err := New(a, 0, Options{HostAccessible: true})
	require.NoError(t, err)
	m, err := eng.Alloc(64)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	_, err = eng.Alloc(64)
	require.ErrorIs(t, err, allocator.ErrClosed)
	require.ErrorIs(t, eng.Free(m, 0), allocator.ErrClosed)
	assert.Equal(t, 1, eng.Stats().Live, "a failed Free changes nothing")
}
