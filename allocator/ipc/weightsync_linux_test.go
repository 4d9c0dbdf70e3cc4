//go:build linux

package ipc_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

// envSyncSteps makes the test binary a weight-sync peer (TestSyncPeer)
// that imports this many steps.
const envSyncSteps = "VMMALLOC_IPC_SYNC_STEPS"

// crossSyncSteps is how many steps TestWeightSyncAcrossProcesses runs.
const crossSyncSteps = 1000

// cudaSyncRig builds a syncRig over the cuda binding and its C test double
// (2 GiB per device), the importer a second binding of this process, which
// opens the exporter's fds as another process would.
func cudaSyncRig(t testing.TB) *syncRig {
	d, dbl, lib := cudaDouble(t)
	require.NoError(t, dbl.SetCapacity(-1, 2<<30))
	imp, err := cuda.Open(cuda.WithLibrary(lib))
	require.NoError(t, err)
	a, err := allocator.New(d, allocator.DefaultConfig())
	require.NoError(t, err)
	x, err := ipc.NewExporter(a)
	require.NoError(t, err)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	is, err := imp.StreamCreate(0)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = x.Close()
		_ = a.Close()
		_ = d.StreamDestroy(s)
		_ = imp.StreamDestroy(is)
		_ = imp.Close()
		_ = d.Close()
	})
	return &syncRig{a: a, x: x, exp: d, s: s, imp: imp, is: is, pids: []int32{imp.Pid()}, alloc: weightBytes,
		used: func() uint64 { return uint64(dbl.Live().UsedBytes) }}
}

// TestWeightSyncCUDADouble is TestWeightSyncEmulated over the cuda binding
// and its C test double: 1,000 steps of 256 MiB on 2 GiB devices, the
// double's device memory in use within two copies during a step and zero
// after it.
func TestWeightSyncCUDADouble(t *testing.T) {
	r := cudaSyncRig(t)
	r.run(t, 1000)
	require.NoError(t, r.x.Close())
	require.NoError(t, r.a.Close())
}

// TestWeightSyncAcrossProcesses runs the weight-sync pattern with the
// importer in another process (the test binary re-executed as
// TestSyncPeer), the descriptors and fds passed over the Unix-socket
// transport: 1,000 steps of 256 MiB on 2 GiB devices of the double, the
// exporter's device memory within two copies during a step and zero after
// it. Each step waits for the peer's acknowledgement that it has read the
// copy and closed its mapping.
func TestWeightSyncAcrossProcesses(t *testing.T) {
	if os.Getenv(envSyncSteps) != "" {
		t.Skip("peer side runs in TestSyncPeer")
	}
	r := cudaSyncRig(t)
	lib, err := cudatest.Shared()
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "sync.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	require.NoError(t, err)
	defer l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSyncPeer$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envSyncSteps+"="+strconv.Itoa(crossSyncSteps), envSocket+"="+sock, cuda.EnvLibrary+"="+lib)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	conn, err := l.AcceptUnix()
	require.NoError(t, err)
	srv := &ipc.Server{PassFDs: true, Allow: ipc.AllowPids(int32(cmd.Process.Pid))}
	ack := make([]byte, 512)
	for i := 0; i < crossSyncSteps; i++ {
		p, err := r.a.Malloc(r.alloc, r.s)
		require.NoError(t, err, "step %d", i)
		require.NoError(t, r.exp.CopyHtoD(p, pattern(probeBytes, byte(i)), r.s))
		require.NoError(t, r.exp.CopyHtoD(p+uintptr(r.alloc-probeBytes), pattern(probeBytes, byte(i)+101), r.s))
		x, err := r.x.Export(p, ipc.ExportOptions{})
		require.NoError(t, err, "step %d", i)
		require.NoError(t, srv.SendExport(conn, x), "step %d", i)
		n, err := conn.Read(ack)
		require.NoError(t, err, "step %d: the peer:\n%s", i, &out)
		require.Equal(t, "ok", string(ack[:n]), "step %d", i)
		require.LessOrEqual(t, r.used(), 2*r.alloc, "step %d", i)
		if i%2 == 0 {
			require.NoError(t, x.Close())
			require.NoError(t, r.a.Free(p))
			require.NoError(t, r.a.EmptyCache())
		} else {
			require.NoError(t, r.a.Free(p))
			require.NoError(t, r.a.EmptyCache())
			require.Equal(t, int64(r.alloc), r.a.Stats().ExporterHeldBytes, "step %d", i)
			require.NoError(t, x.Close())
		}
		require.Zero(t, r.x.Exported(), "step %d", i)
		require.Zero(t, r.used(), "step %d: device memory left in use", i)
	}
	require.NoError(t, cmd.Wait(), "the peer:\n%s", &out)
	assert.Contains(t, out.String(), "--- PASS: TestSyncPeer")
	require.NoError(t, r.a.Check())
}

// TestSyncPeer is the importing process of TestWeightSyncAcrossProcesses:
// per step it receives a descriptor, imports it, checks both ends of the
// copy, closes the mapping and acknowledges ("ok", or what failed).
func TestSyncPeer(t *testing.T) {
	steps, _ := strconv.Atoi(os.Getenv(envSyncSteps))
	if steps == 0 {
		t.Skip("runs as a peer of TestWeightSyncAcrossProcesses")
	}
	d, err := cuda.Open() // the double, from $VMMALLOC_LIBCUDA
	require.NoError(t, err)
	defer d.Close()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: os.Getenv(envSocket), Net: "unixpacket"})
	require.NoError(t, err)
	defer conn.Close()
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	got := make([]byte, probeBytes)
	for i := 0; i < steps; i++ {
		m, err := ipc.ImportFrom(conn, d, 0)
		if err == nil {
			err = d.CopyDtoH(got, m.Ptr, s)
			if err == nil && !bytes.Equal(got, pattern(probeBytes, byte(i))) {
				err = fmt.Errorf("head of step %d's copy differs", i)
			}
			if err == nil {
				err = d.CopyDtoH(got, m.Ptr+uintptr(m.Size-probeBytes), s)
			}
			if err == nil && !bytes.Equal(got, pattern(probeBytes, byte(i)+101)) {
				err = fmt.Errorf("tail of step %d's copy differs", i)
			}
			if cerr := m.Close(); err == nil {
				err = cerr
			}
		}
		msg := "ok"
		if err != nil {
			msg = fmt.Sprintf("step %d: %v", i, err)
		}
		_, werr := conn.Write([]byte(msg))
		require.NoError(t, err)
		require.NoError(t, werr)
	}
	require.NoError(t, d.StreamDestroy(s))
}

// BenchmarkWeightSyncCUDADouble: steps of 256 MiB over the cuda binding
// and its C test double, the importer a second binding of this process.
func BenchmarkWeightSyncCUDADouble(b *testing.B) {
	benchSync(b, cudaSyncRig(b))
}
