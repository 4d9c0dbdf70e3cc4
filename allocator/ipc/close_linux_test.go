//go:build linux

package ipc_test

import (
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/ipc"
)

// TestServerClose: Close stops a Serve in progress (it returns nil), and
// afterwards Send and Serve fail with ErrClosed, sending nothing; Close is
// idempotent.
func TestServerClose(t *testing.T) {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s.sock"), Net: "unixpacket"})
	require.NoError(t, err)
	defer l.Close()
	srv := &ipc.Server{Allow: ipc.AllowPids()}
	d := validDescriptor()
	// The first peer is refused; its outcome shows Serve is accepting, so
	// Close below closes a listener in use.
	outcomes := make(chan error, 1)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l, d, func(_ ipc.Cred, err error) { outcomes <- err }) }()
	c, err := net.DialUnix("unixpacket", nil, l.Addr().(*net.UnixAddr))
	require.NoError(t, err)
	_, _, err = ipc.Receive(c)
	require.Error(t, err)
	require.Error(t, <-outcomes)
	c.Close()

	require.NoError(t, srv.Close())
	require.NoError(t, <-served, "Close ends Serve")
	for i := 0; i < 2; i++ {
		require.NoError(t, srv.Close(), "Close is idempotent")
	}
	a, b := socketPair(t)
	require.ErrorIs(t, srv.Send(a, d), ipc.ErrClosed)
	l2, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "t.sock"), Net: "unixpacket"})
	require.NoError(t, err)
	defer l2.Close()
	require.ErrorIs(t, srv.Serve(l2, d, nil), ipc.ErrClosed)
	// Nothing was sent on the pair.
	require.NoError(t, a.Close())
	_, _, err = ipc.Receive(b)
	require.ErrorIs(t, err, io.EOF, "the peer sees only the close")
	assert.NoError(t, l2.Close(), "Serve on a closed Server leaves its listener open")
}
