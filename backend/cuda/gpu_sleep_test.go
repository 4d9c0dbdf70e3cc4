//go:build unix

package cuda_test

import (
	"fmt"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/host"
)

// TestGPUSleepWake times sleep and wake of a pool on the GPU check's
// driver: the backup and restore bandwidth next to a raw pinned copy of
// the same bytes through the same Copier, and the unmap (discard sleep)
// and remap (wake without backup) latency of 1 GiB (64 MiB against the
// double).
func TestGPUSleepWake(t *testing.T) {
	d := gpuDriver(t)
	size := uint64(1 << 30)
	if os.Getenv("VMMALLOC_GPUCHECK") == "double" {
		size = 64 << 20
	}
	a, err := allocator.New(d, allocator.DefaultConfig())
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	pinned, err := host.New(d, host.DefaultConfig())
	require.NoError(t, err)
	defer func() { require.NoError(t, pinned.Close()) }()
	p, err := a.NewPool(allocator.PoolOptions{Name: "weights"})
	require.NoError(t, err)
	w, err := p.Malloc(size, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Free(w)) }()
	s := a.DefaultStream()

	// Raw pinned copies of the same bytes.
	hp, err := pinned.Malloc(size)
	require.NoError(t, err)
	buf := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&hp))), size)
	t0 := time.Now()
	require.NoError(t, d.CopyDtoH(buf, w, s))
	rawDtoH := time.Since(t0)
	t0 = time.Now()
	require.NoError(t, d.CopyHtoD(w, buf, s))
	rawHtoD := time.Since(t0)
	require.NoError(t, pinned.Free(hp))

	gibps := func(dt time.Duration) float64 { return float64(size) / float64(1<<30) / dt.Seconds() }
	var sleepT, wakeT time.Duration
	for i := range 3 { // the first allocates the pinned buffers; then kept
		t0 = time.Now()
		require.NoError(t, p.Sleep(allocator.SleepOptions{Mode: allocator.Offload, Host: pinned, KeepHostBuffers: true}))
		st := time.Since(t0)
		t0 = time.Now()
		require.NoError(t, p.Wake())
		wt := time.Since(t0)
		if i > 0 {
			sleepT, wakeT = st, wt
		}
	}
	fmt.Printf("GPUCHECK sleep backup %d MiB: %.2f GiB/s (raw pinned DtoH %.2f GiB/s, ratio %.2f)\n", size>>20, gibps(sleepT), gibps(rawDtoH), rawDtoH.Seconds()/sleepT.Seconds())
	fmt.Printf("GPUCHECK wake restore %d MiB: %.2f GiB/s (raw pinned HtoD %.2f GiB/s, ratio %.2f)\n", size>>20, gibps(wakeT), gibps(rawHtoD), rawHtoD.Seconds()/wakeT.Seconds())
	t0 = time.Now()
	require.NoError(t, p.Sleep(allocator.SleepOptions{Mode: allocator.Discard}))
	unmapT := time.Since(t0)
	t0 = time.Now()
	require.NoError(t, p.Wake())
	remapT := time.Since(t0)
	fmt.Printf("GPUCHECK sleep discard %d MiB (unmap+release): %.2f ms; wake without backup (create+map+access): %.2f ms\n", size>>20,
		float64(unmapT.Microseconds())/1e3, float64(remapT.Microseconds())/1e3)
	require.NoError(t, a.Check())
}
