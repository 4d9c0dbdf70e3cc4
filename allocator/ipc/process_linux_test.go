//go:build linux

package ipc_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator"
	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
	"github.com/vmmalloc/vmmalloc/backend/cuda/cudatest"
)

// Environment of the peer processes TestAcrossProcesses starts: the test
// binary re-executed to run TestPeer in one role.
const (
	envRole   = "VMMALLOC_IPC_PEER"   // reader, stranger, holder
	envSocket = "VMMALLOC_IPC_SOCKET" // the exporter's socket
	envSize   = "VMMALLOC_IPC_BYTES"
)

const crossBytes = 7 << 20 // four 2 MiB handles

// cudaDouble opens the binding over a fresh CUDA test double, or skips.
func cudaDouble(t testing.TB) (*cuda.Driver, *cudatest.Double, string) {
	t.Helper()
	path, err := cudatest.Shared()
	if err != nil {
		t.Skipf("CUDA test double unavailable: %v", err)
	}
	dbl, err := cudatest.Open(path)
	require.NoError(t, err)
	dbl.Reset()
	d, err := cuda.Open(cuda.WithLibrary(path))
	require.NoError(t, err)
	// No fd of the double's handles may be closed behind its back.
	t.Cleanup(func() { require.NoError(t, dbl.BackingError()) })
	return d, dbl, path
}

// TestAcrossProcesses shares an allocation of the cuda binding (over the
// test double, whose handles are memfds: real shared memory) with real
// processes over the Unix-socket transport: a whitelisted reader reads
// the pattern and writes back, a stranger is refused, and a holder killed
// while it maps the memory leaves nothing behind in the exporter.
func TestAcrossProcesses(t *testing.T) {
	if os.Getenv(envRole) != "" {
		t.Skip("peer side runs in TestPeer")
	}
	d, dbl, lib := cudaDouble(t)
	cfg, err := allocator.ParseConfig("large_segment_size_mb:2")
	require.NoError(t, err)
	a, err := allocator.New(d, cfg)
	require.NoError(t, err)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	p, err := a.Malloc(crossBytes, s)
	require.NoError(t, err)
	want := pattern(crossBytes, 5)
	require.NoError(t, d.CopyHtoD(p, want, s))
	ex, err := ipc.NewExporter(a)
	require.NoError(t, err)
	x, err := ex.Export(p, ipc.ExportOptions{})
	require.NoError(t, err)
	require.Len(t, x.Handles, 4)

	sock := filepath.Join(t.TempDir(), "export.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	require.NoError(t, err)
	var mu sync.Mutex
	allowed := map[int32]bool{}
	srv := &ipc.Server{PassFDs: true, Allow: func(c ipc.Cred) error {
		mu.Lock()
		defer mu.Unlock()
		if !allowed[c.Pid] {
			return ipc.AllowPids()(c)
		}
		return nil
	}}
	outcomes := make(chan error, 8)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l, x.Descriptor, func(_ ipc.Cred, err error) { outcomes <- err }) }()

	peer := func(role string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPeer$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), envRole+"="+role, envSocket+"="+sock, cuda.EnvLibrary+"="+lib)
		return cmd
	}
	start := func(cmd *exec.Cmd, allow bool) *bufio.Reader {
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = cmd.Stdout
		mu.Lock() // the peer cannot be served before its pid is known
		require.NoError(t, cmd.Start())
		if allow {
			allowed[int32(cmd.Process.Pid)] = true
		}
		mu.Unlock()
		return bufio.NewReader(out)
	}
	readAll := func(r *bufio.Reader) string {
		var b strings.Builder
		_, _ = r.WriteTo(&b)
		return b.String()
	}

	// The reader: reads the pattern, writes its own back.
	reader := peer("reader")
	out := start(reader, true)
	text := readAll(out)
	require.NoError(t, reader.Wait(), "reader:\n%s", text)
	require.Contains(t, text, "--- PASS: TestPeer")
	require.NoError(t, <-outcomes)
	got := make([]byte, crossBytes)
	require.NoError(t, d.CopyDtoH(got, p, s))
	assert.True(t, bytes.Equal(pattern(crossBytes, 77), got), "the exporter sees the reader's write")

	// The stranger: refused, with no fds.
	stranger := peer("stranger")
	out = start(stranger, false)
	text = readAll(out)
	require.NoError(t, stranger.Wait(), "stranger:\n%s", text)
	require.Contains(t, text, "--- PASS: TestPeer")
	require.ErrorIs(t, <-outcomes, backend.ErrNotPermitted)

	// The holder: imported and mapped, then killed.
	live := dbl.Live()
	holder := peer("holder")
	// The holder blocks reading its stdin until killed: this end stays
	// open (unwritten) until Wait.
	_, err = holder.StdinPipe()
	require.NoError(t, err)
	out = start(holder, true)
	line, err := out.ReadString('\n')
	for err == nil && !strings.HasPrefix(line, "MAPPED") {
		line, err = out.ReadString('\n')
	}
	require.NoError(t, err, "holder never mapped")
	require.NoError(t, <-outcomes)
	require.NoError(t, holder.Process.Kill())
	_ = holder.Wait()
	assert.Equal(t, live, dbl.Live(), "the killed importer changed the exporter's driver objects")

	require.NoError(t, l.Close())
	require.NoError(t, <-served)
	require.NoError(t, x.Close())
	require.NoError(t, a.Free(p))
	require.NoError(t, ex.Close())
	require.NoError(t, a.Close())
	require.NoError(t, d.StreamDestroy(s))
	require.NoError(t, d.Close())
	live = dbl.Live()
	assert.Zero(t, live.Reservations+live.Mappings+live.Handles, "the exporter leaked: %+v", live)
}

// TestPeer is the importing side of TestAcrossProcesses.
func TestPeer(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("runs as a peer of TestAcrossProcesses")
	}
	d, err := cuda.Open() // the double, from $VMMALLOC_LIBCUDA
	require.NoError(t, err)
	defer d.Close()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: os.Getenv(envSocket), Net: "unixpacket"})
	require.NoError(t, err)
	defer conn.Close()
	m, err := ipc.ImportFrom(conn, d, 0)
	if role == "stranger" {
		require.ErrorIs(t, err, backend.ErrNotPermitted)
		return
	}
	require.NoError(t, err)
	require.Equal(t, uint64(crossBytes), m.Size)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	if role == "holder" {
		os.Stdout.WriteString("MAPPED\n")
		_, _ = io.Copy(io.Discard, os.Stdin) // until killed by the exporter (or it exits)
		return
	}
	got := make([]byte, crossBytes)
	require.NoError(t, d.CopyDtoH(got, m.Ptr, s))
	require.True(t, bytes.Equal(pattern(crossBytes, 5), got), "the reader sees the exporter's bytes")
	require.NoError(t, d.CopyHtoD(m.Ptr, pattern(crossBytes, 77), s))
	require.NoError(t, d.StreamDestroy(s))
	require.NoError(t, m.Close())
	if err := d.Close(); err != nil && !errors.Is(err, backend.ErrUnavailable) {
		require.NoError(t, err)
	}
}
