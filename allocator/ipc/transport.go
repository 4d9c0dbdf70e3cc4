//go:build linux

package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vmmalloc/vmmalloc/backend"
	"github.com/vmmalloc/vmmalloc/backend/cuda"
)

// MaxFDs is the most handles one descriptor may have over the transport
// when it passes fds: the kernel's limit of fds in one SCM_RIGHTS message
// (SCM_MAX_FD).
const MaxFDs = 253

// Cred is a peer's credentials as the kernel reports them (SO_PEERCRED).
type Cred struct {
	Pid      int32
	UID, GID uint32
}

// AllowPids is a Server.Allow that admits exactly pids.
func AllowPids(pids ...int32) func(Cred) error {
	return func(c Cred) error {
		for _, p := range pids {
			if c.Pid == p {
				return nil
			}
		}
		return fmt.Errorf("ipc: pid %d is not allowed: %w", c.Pid, backend.ErrNotPermitted)
	}
}

// Server hands a descriptor to peers over a Unix socket of type
// "unixpacket" (SOCK_SEQPACKET: one message per descriptor). It checks
// every peer's credentials first; a peer Allow refuses gets a refusal and
// no fds. The zero Server (with Allow set) is ready to use; after Close,
// Send and Serve return errors wrapping ErrClosed.
type Server struct {
	// Allow admits a peer (nil: nobody). Its error should wrap
	// backend.ErrNotPermitted.
	Allow func(Cred) error
	// PassFDs sends the fds inside the shareable handles (CUDA's POSIX fd
	// handles: backend/cuda) with SCM_RIGHTS, for the peer to import.
	// Without it the shareables travel as numbers (ACL, the emulator).
	PassFDs bool

	mu      sync.Mutex
	serving map[*net.UnixListener]bool // listeners Serve accepts on; mu
	closed  bool                       // mu
}

// Close stops the Server: it closes every listener Serve is accepting on
// (those Serve calls return nil), and Send and Serve return errors
// wrapping ErrClosed afterwards. A Send in progress completes. Close is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ls := s.serving
	s.serving = nil
	s.mu.Unlock()
	var errs []error
	for l := range ls {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isClosed reports whether Close was called.
func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Wire format: one message, status byte then, for statusOK, the binary
// descriptor (fds attached in handle order when PassFDs), for
// statusRefused, the reason.
const (
	statusOK      = 0
	statusRefused = 1
	maxMsgLen     = 1 + headerLen + MaxHandles*handleLen
)

// PeerCred reads the credentials of the process at the other end of conn.
func PeerCred(conn *net.UnixConn) (Cred, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var uc *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, err
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("ipc: SO_PEERCRED: %w", serr)
	}
	return Cred{Pid: uc.Pid, UID: uc.Uid, GID: uc.Gid}, nil
}

// Send checks the peer on conn and sends it d, or a refusal. The error
// wraps backend.ErrNotPermitted when the peer was refused. With PassFDs
// the fds sent are the exporting Driver's own (cuda.BorrowedFD), which the
// kernel copies into the message: Send neither takes nor closes them, and
// d must come from an Export that stays open until Send returns, since the
// Driver closes those fds once the Exporter lets go of the handles, and
// their numbers may then name other files. SendExport checks that for the
// caller.
func (s *Server) Send(conn *net.UnixConn, d Descriptor) error {
	if s.isClosed() {
		return fmt.Errorf("ipc: send on a closed Server: %w", ErrClosed)
	}
	var fds []int
	if s.PassFDs {
		if len(d.Handles) > MaxFDs {
			return fmt.Errorf("ipc: %d handles, at most %d fds per message: %w", len(d.Handles), MaxFDs, backend.ErrNotSupported)
		}
		fds = make([]int, len(d.Handles))
		for i, h := range d.Handles {
			fds[i] = cuda.BorrowedFD(h.Shareable) // copied by the kernel at the send
		}
	}
	return s.send(conn, d, fds)
}

// SendExport is Send of x's Descriptor that cannot pass a stale fd: with
// PassFDs it duplicates the fds while x is open (under the Exporter's
// lock, so no free can close them meanwhile), sends the duplicates and
// closes them. On a closed Export it sends nothing and returns an error
// wrapping ErrClosed.
func (s *Server) SendExport(conn *net.UnixConn, x *Export) error {
	if s.isClosed() {
		return fmt.Errorf("ipc: send on a closed Server: %w", ErrClosed)
	}
	if !s.PassFDs {
		x.e.mu.Lock()
		open := x.hs != nil
		x.e.mu.Unlock()
		if !open {
			return fmt.Errorf("ipc: send of a closed export: %w", ErrClosed)
		}
		return s.send(conn, x.Descriptor, nil)
	}
	if len(x.Handles) > MaxFDs {
		return fmt.Errorf("ipc: %d handles, at most %d fds per message: %w", len(x.Handles), MaxFDs, backend.ErrNotSupported)
	}
	fds, err := x.dupFDs()
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd) // ours: the duplicates
		}
	}()
	if err != nil {
		return err
	}
	return s.send(conn, x.Descriptor, fds)
}

// dupFDs duplicates the fds inside x's shareables while x is open: the
// Exporter's reference to each handle keeps the driver's fd open.
func (x *Export) dupFDs() ([]int, error) {
	x.e.mu.Lock()
	defer x.e.mu.Unlock()
	if x.hs == nil {
		return nil, fmt.Errorf("ipc: send of a closed export: %w", ErrClosed)
	}
	fds := make([]int, 0, len(x.Handles))
	for _, h := range x.Handles {
		fd, err := unix.FcntlInt(uintptr(cuda.BorrowedFD(h.Shareable)), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return fds, fmt.Errorf("ipc: duplicating the fd of shareable %#x: %w", h.Shareable, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// send checks the peer on conn and sends it d with fds, or a refusal.
func (s *Server) send(conn *net.UnixConn, d Descriptor, fds []int) error {
	c, err := PeerCred(conn)
	if err != nil {
		return err
	}
	allow := s.Allow
	if allow == nil {
		allow = AllowPids()
	}
	if aerr := allow(c); aerr != nil {
		if !errors.Is(aerr, backend.ErrNotPermitted) {
			aerr = fmt.Errorf("%w: %w", backend.ErrNotPermitted, aerr)
		}
		_, _, werr := conn.WriteMsgUnix(append([]byte{statusRefused}, aerr.Error()...), nil, nil)
		return errors.Join(aerr, werr)
	}
	b, err := d.MarshalBinary()
	if err != nil {
		return err
	}
	var oob []byte
	if fds != nil {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = conn.WriteMsgUnix(append([]byte{statusOK}, b...), oob, nil)
	return err
}

// Serve accepts peers on l and sends d to each (Send), until l is closed
// (by the caller or by Close); then it returns nil. A refused or failed
// peer does not stop it: report, if not nil, hears of every peer's
// outcome. On a closed Server it returns an error wrapping ErrClosed and
// leaves l open. With PassFDs, d's Export must stay open while Serve runs
// (see Send).
func (s *Server) Serve(l *net.UnixListener, d Descriptor, report func(Cred, error)) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("ipc: serve on a closed Server: %w", ErrClosed)
	}
	if s.serving == nil {
		s.serving = make(map[*net.UnixListener]bool)
	}
	s.serving[l] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.serving, l)
		s.mu.Unlock()
	}()
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		c, _ := PeerCred(conn)
		err = s.Send(conn, d)
		conn.Close()
		if report != nil {
			report(c, err)
		}
	}
}

// Receive reads one descriptor from conn. Fds that came with it are
// returned open, in handle order, and the shareables rewritten to carry
// them (cuda.Shareable): the caller imports, then closes the files. A
// refusal is an error wrapping backend.ErrNotPermitted; a malformed
// message one wrapping ErrBadDescriptor, with any fds closed.
func Receive(conn *net.UnixConn) (Descriptor, []*os.File, error) {
	buf := make([]byte, maxMsgLen)
	oob := make([]byte, unix.CmsgSpace(4*MaxFDs))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return Descriptor{}, nil, fmt.Errorf("ipc: receive: %w", err)
	}
	var files []*os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return Descriptor{}, nil, fmt.Errorf("%w: control message: %v", ErrBadDescriptor, err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), "shareable"))
			}
		}
	}
	fail := func(err error) (Descriptor, []*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return Descriptor{}, nil, err
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fail(fmt.Errorf("%w: message truncated (flags %#x)", ErrBadDescriptor, flags))
	}
	if n == 0 {
		return fail(fmt.Errorf("%w: empty message (peer closed?)", ErrBadDescriptor))
	}
	if buf[0] == statusRefused {
		return fail(fmt.Errorf("ipc: the exporter refused: %s: %w", buf[1:n], backend.ErrNotPermitted))
	}
	if buf[0] != statusOK {
		return fail(fmt.Errorf("%w: status %d", ErrBadDescriptor, buf[0]))
	}
	var d Descriptor
	if err := d.UnmarshalBinary(buf[1:n]); err != nil {
		return fail(err)
	}
	if files != nil {
		if len(files) != len(d.Handles) {
			return fail(fmt.Errorf("%w: %d fds for %d handles", ErrBadDescriptor, len(files), len(d.Handles)))
		}
		for i := range d.Handles {
			d.Handles[i].Shareable = cuda.Shareable(int(files[i].Fd()), d.Handles[i].Size)
		}
	}
	return d, files, nil
}

// ImportFrom receives a descriptor from conn (Receive) and imports it
// over drv on device dev (Import), closing the received fds after.
func ImportFrom(conn *net.UnixConn, drv backend.Driver, dev int) (*Mapping, error) {
	d, files, err := Receive(conn)
	if err != nil {
		return nil, err
	}
	m, err := Import(drv, d, dev)
	for _, f := range files {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	if err != nil && m != nil {
		err = errors.Join(err, m.Close())
		m = nil
	}
	return m, err
}
