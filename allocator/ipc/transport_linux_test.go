//go:build linux

package ipc_test

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmmalloc/vmmalloc/allocator/ipc"
	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
)

// socketPair returns two connected SOCK_SEQPACKET Unix sockets.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestTransportCredentials sends a descriptor of numeric shareables (no
// fds: ACL, the emulator) to a peer the policy admits (this process, by
// its kernel-reported pid) and refuses one it does not: both sides see
// ErrNotPermitted.
func TestTransportCredentials(t *testing.T) {
	d := validDescriptor()
	rows := []struct {
		name  string
		allow func(ipc.Cred) error
		want  error
	}{
		{"admitted by pid", ipc.AllowPids(int32(os.Getpid())), nil},
		{"refused", ipc.AllowPids(1), backend.ErrNotPermitted},
		{"no policy refuses everybody", nil, backend.ErrNotPermitted},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			a, b := socketPair(t)
			c, err := ipc.PeerCred(a)
			require.NoError(t, err)
			assert.Equal(t, int32(os.Getpid()), c.Pid)
			assert.Equal(t, uint32(os.Getuid()), c.UID)

			srv := &ipc.Server{Allow: r.allow}
			serr := srv.Send(a, d)
			got, files, rerr := ipc.Receive(b)
			if r.want == nil {
				require.NoError(t, serr)
				require.NoError(t, rerr)
				assert.Nil(t, files)
				assert.Equal(t, d, got)
				return
			}
			require.ErrorIs(t, serr, r.want)
			require.ErrorIs(t, rerr, r.want)
			assert.Nil(t, files)
		})
	}
}

// TestReceiveHostile feeds Receive malformed messages, with fds attached:
// each is ErrBadDescriptor and the fds it carried are closed.
func TestReceiveHostile(t *testing.T) {
	good, err := validDescriptor().MarshalBinary()
	require.NoError(t, err)
	rows := []struct {
		name string
		msg  []byte
		fds  int
	}{
		{"unknown status", append([]byte{9}, good...), 0},
		{"garbage descriptor", []byte{0, 1, 2, 3}, 1},
		{"fds do not match the handles", append([]byte{0}, good...), 2},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			a, b := socketPair(t)
			var oob []byte
			var sent []*os.File
			for i := 0; i < r.fds; i++ {
				f, err := os.CreateTemp(t.TempDir(), "fd")
				require.NoError(t, err)
				defer f.Close()
				sent = append(sent, f)
			}
			if r.fds > 0 {
				fds := make([]int, len(sent))
				for i, f := range sent {
					fds[i] = int(f.Fd())
				}
				oob = syscall.UnixRights(fds...)
			}
			_, _, err := a.WriteMsgUnix(r.msg, oob, nil)
			require.NoError(t, err)
			before := openFDs(t)
			_, files, err := ipc.Receive(b)
			require.ErrorIs(t, err, ipc.ErrBadDescriptor)
			assert.Nil(t, files)
			assert.Equal(t, before, openFDs(t), "received fds leaked")
		})
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(es)
}

// fileOf is the (device, inode) of the file fd names.
func fileOf(t *testing.T, fd int) [2]uint64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(fd, &st))
	return [2]uint64{uint64(st.Dev), uint64(st.Ino)}
}

// TestSendExport: SendExport passes the exported memory's files
// (duplicates it closes after the send, never the Driver's own fds), and
// refuses a closed Export, whose fds the Driver may have closed and whose
// numbers may name other files by then.
func TestSendExport(t *testing.T) {
	r := cudaSyncRig(t)
	p, err := r.a.Malloc(weightBytes, r.s)
	require.NoError(t, err)
	x, err := r.x.Export(p, ipc.ExportOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, x.Handles)
	a, b := socketPair(t)
	srv := &ipc.Server{PassFDs: true, Allow: ipc.AllowPids(int32(os.Getpid()))}
	before := openFDs(t)
	require.NoError(t, srv.SendExport(a, x))
	assert.Equal(t, before, openFDs(t), "the duplicates were closed after the send")
	got, files, err := ipc.Receive(b)
	require.NoError(t, err)
	require.Len(t, files, len(x.Handles))
	for i, f := range files {
		assert.Equal(t, fileOf(t, cuda.BorrowedFD(x.Handles[i].Shareable)), fileOf(t, int(f.Fd())), "handle %d", i)
		assert.Equal(t, x.Handles[i].Size, got.Handles[i].Size)
		require.NoError(t, f.Close())
	}
	for i := range x.Handles {
		fileOf(t, cuda.BorrowedFD(x.Handles[i].Shareable)) // the Driver's fds are open
	}

	require.NoError(t, x.Close())
	require.NoError(t, r.a.Free(p))
	require.NoError(t, r.a.EmptyCache())
	require.Zero(t, r.x.Exported(), "the Driver freed the handles and closed their fds")
	require.ErrorIs(t, srv.SendExport(a, x), ipc.ErrClosed)
	// Nothing was sent: a read that does not wait finds no message.
	require.NoError(t, b.SetReadDeadline(time.Now()))
	_, _, err = ipc.Receive(b)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}
